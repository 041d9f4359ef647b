#!/usr/bin/env bash
# run57 (2026-11-30, session 7): two variant sweeps at M = 1, 8, 9, 12, 14, 16 of every warp bulk-prefetching
# its next 1 or 2 iterations into L2 before the PDL wait (Config.npf) against the defaults, every candidate checked
# against an fp32 reference first. Run after staging the wheels (see run_gpu.sh), with PYTHONPATH
# and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,8,9,12,14,16 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
