#!/usr/bin/env bash
# run39 (2026-11-30, session 6): variant sweep of the consumer epoch read inside the poll (pe) and the
# producers' W_FB L2 prefetch with evict_last (fbpf/fbel) at M = 1, 4, 5, 8, 9, 12, 16, then the tagged
# fused GPU tests (pe variant alternating on one workspace and in a side-stream graph); run after
# staging the wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
timeout 300 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,4,5,8,9,12,16 --out $OUT/v > $OUT/vsweep.log 2>&1; echo rc=$? >> $OUT/vsweep.log
timeout 150 python3 -m pytest -q -x -m gpu tests/test_cute_kernels.py -k "tagged or fused_step" -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
