#!/usr/bin/env bash
# Final GPU proof of the session-7 code (2026-11-30; the m_tile-16 fused defaults with the launch
# bound minb 3 (swapped, and unswapped with one consumer pass), the GraphedExecutor pool fix): the
# same steps as session 5's final script - the one-GPU pytest suite, the compiled-plan KDA step
# bench twice, `planner bench`, compute-sanitizer memcheck and the kernel-level table. Run after
# staging the wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set. Run twice this
# session: final (at 2cccaeb) and final2 (at the commit that adds this line's run).
exec bash "$(dirname "$0")/run_gpu_session5_final2.sh"
