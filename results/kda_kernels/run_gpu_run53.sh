#!/usr/bin/env bash
# run53 (2026-11-30, session 7): two variant sweeps at M = 8, 9, 12, 14, 16: the producers' whole-share
# L2 prefetch after the PDL wait (ppf 2), and the unswapped m_tile-16 kernel (the path without a
# prepacked weight) with minb 3 and one or two consumer passes. Run after staging the wheels (see
# run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 8,9,12,14,16 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
