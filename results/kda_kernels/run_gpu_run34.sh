#!/usr/bin/env bash
# run34 (2026-11-30, session 5): variant sweep incl. 6 consumer blocks with the new epoch, and the
# kernel-level table (floor from the higher of two bandwidth reads); run after staging the wheels
# (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
timeout 150 python3 scripts/bench_kda_kernels.py --variant-sweep --out $OUT/a > $OUT/vsweep.log 2>&1; echo rc=$? >> $OUT/vsweep.log
timeout 200 python3 scripts/bench_kda_kernels.py --no-sweep --out $OUT/kernels > $OUT/kernels.log 2>&1; echo rc=$? >> $OUT/kernels.log
