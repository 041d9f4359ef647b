#!/usr/bin/env bash
# run49 (2026-11-30, session 6): swapped mma roles (swap = 1, weights prepacked in A-fragment order,
# wl = 2): the GPU correctness test, then two variant sweeps in separate processes at M = 1, 4, 8, 9,
# 12, 16; run after staging the wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -x -m gpu tests/test_cute_kernels.py -k "swap_roles" -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
for r in a b; do
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,4,8,9,12,16 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
