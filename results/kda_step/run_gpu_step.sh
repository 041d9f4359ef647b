#!/usr/bin/env bash
# The one-GPU pytest suite and the compiled-plan KDA bench (session 4 runs d, e; session 5 runs s5a.. with RUN=s5a ...)
# (21 trials, random replay order). Run after staging the wheels
# (results/kda_kernels/run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/nvidia_smi.txt
timeout 200 python3 -m pytest -q -m gpu tests/test_cute_kernels.py tests/test_gemm_chain.py tests/test_executor_gpu.py tests/test_strided_add.py -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
timeout 200 python3 scripts/bench_kda_step.py --tuning results/tuning/2026-11-30_h200_k3_kda_projection.json --out $OUT/${RUN:-d} > $OUT/step_${RUN:-d}.log 2>&1; echo rc=$? >> $OUT/step_${RUN:-d}.log
