#!/usr/bin/env bash
# Final GPU proof of the session-8 code (2026-11-30; the fused defaults store g1 as bf16x2 pairs
# (gst 1), the unswapped tagged fused kernel at every M; from run61 the m_tile-16 default loads 3 of
# iteration 0's 4 K steps before the PDL wait, pwu 3): the same steps as session 5's final script -
# the one-GPU pytest suite, the compiled-plan KDA step bench twice, `planner bench`, compute-sanitizer
# memcheck and the kernel-level table. Run after staging the wheels (see run_gpu.sh), with PYTHONPATH
# and PLANNER_CACHE_DIR set.
exec bash "$(dirname "$0")/run_gpu_session5_final2.sh"
