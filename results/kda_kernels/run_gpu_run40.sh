#!/usr/bin/env bash
# run40 (2026-11-30, session 6): the producers' W_FB L2 prefetch (fbpf, counted from after the mma steps
# of stream iteration NIT - fbpf; fbel = evict_last) against the defaults, two sweeps in separate
# processes at M = 1, 3, 5, 6, 8, 9, 12, 16; run after staging the wheels (see run_gpu.sh), with
# PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,3,5,6,8,9,12,16 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
