#!/usr/bin/env bash
# Final GPU proof of the 2026-11-30 session-5 code (K interleave, fire-and-forget tag epoch, the m_tile-16 fused kernel at M = 9..16):
# the one-GPU pytest suite, the compiled-plan KDA step bench twice, compute-sanitizer memcheck,
# and the kernel-level bench table. Run after staging the wheels (see run_gpu.sh), with
# PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu tests/test_cute_kernels.py tests/test_gemm_chain.py tests/test_executor_gpu.py tests/test_strided_add.py -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
for run in a b; do
  timeout 100 python3 scripts/bench_kda_step.py --tuning results/tuning/2026-11-30_h200_k3_kda_projection.json --out $OUT/$run > $OUT/step_$run.log 2>&1; echo rc=$? >> $OUT/step_$run.log
done
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 100 "$CS" --tool memcheck --print-limit 20 python3 scripts/bench_kda_kernels.py --sanitize > $OUT/memcheck.txt 2>&1; echo rc=$? >> $OUT/memcheck.txt
timeout 170 python3 scripts/bench_kda_kernels.py --no-sweep --out $OUT/kernels > $OUT/kernels.log 2>&1; echo rc=$? >> $OUT/kernels.log
