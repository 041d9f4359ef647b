#!/usr/bin/env bash
# Final GPU proof of the session-5 code (2026-11-30; K interleave, fire-and-forget tag epoch, the
# m_tile-16 fused kernel at M = 9..16 with 6 consumer blocks at 9..15): the one-GPU pytest suite,
# the compiled-plan KDA step bench twice, `planner bench`, compute-sanitizer memcheck and the
# kernel-level table. Run after staging the wheels (see run_gpu.sh), with PYTHONPATH and
# PLANNER_CACHE_DIR set. Only 8 files come back from the device: full outputs go to /tmp/full.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/full
export PYTHONUNBUFFERED=1
T=${TUNING:-results/tuning/2026-11-30_h200_k3_kda_projection.json}  # (session 9: overridable)
timeout 200 python3 -m pytest -q -m gpu tests/test_cute_kernels.py tests/test_gemm_chain.py tests/test_executor_gpu.py tests/test_strided_add.py -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
for run in a b; do
  timeout 100 python3 scripts/bench_kda_step.py --tuning $T --out /tmp/full/$run > $OUT/step_$run.log 2>&1; echo rc=$? >> $OUT/step_$run.log
done
cp /tmp/full/a/kda_step.json $OUT/step_a.json
timeout 150 python3 -m planner.cli bench plans/k3_kda_projection.yaml --tuning $T --out /tmp/full/pb > $OUT/planner_bench.log 2>&1; echo rc=$? >> $OUT/planner_bench.log
cat /tmp/full/pb/*.md >> $OUT/planner_bench.log 2>/dev/null
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 100 "$CS" --tool memcheck --print-limit 20 python3 scripts/bench_kda_kernels.py --sanitize > $OUT/memcheck.txt 2>&1; echo rc=$? >> $OUT/memcheck.txt
timeout 170 python3 scripts/bench_kda_kernels.py --no-sweep --out /tmp/full/kernels > $OUT/kernels.log 2>&1; echo rc=$? >> $OUT/kernels.log
