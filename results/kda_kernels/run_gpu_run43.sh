#!/usr/bin/env bash
# run43 (2026-11-30, session 6): the one-GPU pytest suite at the final code (run42's 5 failures were a
# name clash in the new test) and the per-block timeline of the fused defaults at M = 8, 9, 12, 16;
# run after staging the wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu tests/test_cute_kernels.py tests/test_gemm_chain.py tests/test_executor_gpu.py tests/test_strided_add.py -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
timeout 120 python3 scripts/fused_timeline.py --cases 12,15,16,17,18,19 --out $OUT/tl > $OUT/timeline.log 2>&1; echo rc=$? >> $OUT/timeline.log
