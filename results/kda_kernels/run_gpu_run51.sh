#!/usr/bin/env bash
# run51 (2026-11-30, session 7): the GPU tests of the executor's prepacked weight again (the
# GraphedExecutor now takes a fresh graph pool after dropping its graphs: run50 tripped torch's
# allocator assert capturing into the released one), the timeline of the m_tile-16 default with
# minb 3 (cases 25, 26), and two variant sweeps at M = 9..16 (minb 3 with u2, the W_FB prefetch, two
# consumer passes). Run after staging the wheels (see run_gpu.sh), with PYTHONPATH and
# PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu tests/test_gemm_chain.py tests/test_cute_kernels.py -k "swap_roles or chain" -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
timeout 100 python3 scripts/fused_timeline.py --cases 25,26 --out $OUT/tl > $OUT/timeline.log 2>&1; echo rc=$? >> $OUT/timeline.log
for r in a b; do
timeout 170 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 9,10,12,14,15,16 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
