#!/usr/bin/env bash
# run50 (2026-11-30, session 7): the GPU tests not yet run on a GPU (prepack=False,
# ex.prepacked_bytes, GraphedExecutor dropping graphs after an in-place weight write; the merged
# swap test), the per-block timeline of the swapped-role defaults (scripts/fused_timeline.py cases
# 20-24), and two variant sweeps (M = 8, 9, 12, 16 and M = 9, 16) of where the m_tile-16 swapped
# kernel's time goes. Run after staging the wheels (see run_gpu.sh), with PYTHONPATH and
# PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -x -m gpu tests/test_gemm_chain.py tests/test_cute_kernels.py -k "swap_roles or chain" -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
timeout 120 python3 scripts/fused_timeline.py --cases 20,21,22,23,24 --out $OUT/tl > $OUT/timeline.log 2>&1; echo rc=$? >> $OUT/timeline.log
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 8,9,12,16 --out $OUT/a > $OUT/vsweep_a.log 2>&1; echo rc=$? >> $OUT/vsweep_a.log
timeout 150 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 9,16 --out $OUT/b > $OUT/vsweep_b.log 2>&1; echo rc=$? >> $OUT/vsweep_b.log
