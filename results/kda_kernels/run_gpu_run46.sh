#!/usr/bin/env bash
# run46 (2026-11-30, session 6): the m_tile-16 kernel at M <= 8 with and without its second x row load (dx) against
# m_tile 8, two sweeps in separate processes at M = 1, 4, 8;
# run after staging the wheels (see run_gpu.sh), with
# PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,4,8 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
