#!/usr/bin/env bash
# run62 (2026-11-30, session 8): two variant sweeps at M = 1, 4, 8, 9, 12, 14, 16 of the fused defaults
# against the producer warps of the second K half issuing their L2 prefetch after the PDL wait (Config.ppfh),
# every candidate checked against an fp32 reference first. Run after staging the wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 250 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,4,8,9,12,14,16 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
