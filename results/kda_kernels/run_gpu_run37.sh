#!/usr/bin/env bash
# run37 (2026-11-30, session 5): 6 consumer blocks of two passes also at M <= 4 (m_tile 8) - fused GPU
# tests, variant sweep at M = 1..5 and the compiled-plan step bench at M = 1..8; run after staging the
# wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -x -m gpu tests/test_cute_kernels.py -k "fused_step or tagged or graph_side" -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
timeout 120 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,2,3,4,5 --out $OUT/a > $OUT/vsweep.log 2>&1; echo rc=$? >> $OUT/vsweep.log
timeout 120 python3 scripts/bench_kda_step.py --tuning results/tuning/2026-11-30_h200_k3_kda_projection.json --ms 1..8 --out $OUT/s > $OUT/step.log 2>&1; echo rc=$? >> $OUT/step.log
