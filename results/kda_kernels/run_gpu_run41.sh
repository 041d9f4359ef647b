#!/usr/bin/env bash
# run41 (2026-11-30, session 6): W_FB L2 prefetch (fbpf 3 / 2, with and without evict_last; m_tile 16 capped at
# 80 registers) against the defaults, two sweeps in separate processes at M = 1, 2, 4, 5, 7, 8, 9, 12, 14, 16;
# run after staging the wheels (see run_gpu.sh), with
# PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,2,4,5,7,8,9,12,14,16 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
