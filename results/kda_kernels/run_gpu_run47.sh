#!/usr/bin/env bash
# run47 (2026-11-30, session 6): griddepcontrol.wait through pdl_wait, so that ptxas no longer hoists it
# above the prologue weight loads (the SASS of every non-fused kernel had no weight load before it):
# the kernel-level table and the compiled-plan step bench; run after staging the wheels (see
# run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/full
export PYTHONUNBUFFERED=1
timeout 170 python3 scripts/bench_kda_kernels.py --no-sweep --out /tmp/full/kernels > $OUT/kernels.log 2>&1; echo rc=$? >> $OUT/kernels.log
timeout 100 python3 scripts/bench_kda_step.py --tuning results/tuning/2026-11-30_h200_k3_kda_projection.json --out /tmp/full/s > $OUT/step.log 2>&1; echo rc=$? >> $OUT/step.log
