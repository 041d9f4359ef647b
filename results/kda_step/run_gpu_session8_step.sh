#!/usr/bin/env bash
# Session 8 (2026-11-30): the compiled-plan KDA step bench twice and `planner bench` with the re-tuned file
# (bucket-end probing, ..._s8.json), on whichever H200 the call lands on (its GPU UUID goes to gpu.txt).
# Run after staging the wheels (see ../kda_kernels/run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=uuid,driver_version --format=csv,noheader > $OUT/gpu.txt
TUNING=results/tuning/2026-11-30_h200_k3_kda_projection_s8.json exec bash "$(dirname "$0")/run_gpu_session6_step.sh"
