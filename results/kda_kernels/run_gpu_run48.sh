#!/usr/bin/env bash
# run48 (2026-11-30, session 6): with pdl_wait, the fused kernel against two launches (stream kernel +-ki, then F_B)
# at M = 9..16, two sweeps in separate processes;
# run after staging the wheels (see run_gpu.sh), with
# PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 9,11,12,13,14,15,16 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
