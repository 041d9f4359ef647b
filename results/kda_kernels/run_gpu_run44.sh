#!/usr/bin/env bash
# run44 (2026-11-30, session 6): the x load variants (xld 1: texture path, 2: L1 evict_last) and the m_tile-16
# kernel forced at M <= 8, two sweeps in separate processes at M = 1, 5, 8, 9, 12, 16;
# run after staging the wheels (see run_gpu.sh), with
# PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,5,8,9,12,16 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
