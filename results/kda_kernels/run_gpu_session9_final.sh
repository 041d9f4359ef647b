#!/usr/bin/env bash
# Final GPU proof of the session-9 code (2026-11-30; the fused defaults' SASS is the session-8 final's,
# the kernel source gained diagnostic stamps only): session 5's final steps - the one-GPU pytest suite,
# the compiled-plan KDA step bench twice, `planner bench`, compute-sanitizer memcheck and the kernel-level
# table - with the re-tuned file of session 8, on whichever H200 the call lands on (its GPU UUID goes to
# gpu.txt). Run after staging the wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=uuid,driver_version --format=csv,noheader > $OUT/gpu.txt
TUNING=results/tuning/2026-11-30_h200_k3_kda_projection_s8.json exec bash "$(dirname "$0")/run_gpu_session5_final2.sh"
