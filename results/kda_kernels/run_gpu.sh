#!/usr/bin/env bash
# GPU proof run (after the cutlass wheels are staged into /tmp/site):
# GPU pytest (fused-step tests by default: PYTEST_K), the bench (correctness incl. graph
# replay on a side stream + table), and a compute-sanitizer memcheck run.
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD:$PYTHONPATH
export PYTHONUNBUFFERED=1 PLANNER_CACHE_DIR=$PWD/.planner_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia_smi.txt"
timeout ${PYTEST_T:-200} python3 -m pytest -q -x -m gpu tests/test_cute_kernels.py -k "${PYTEST_K:-fused}" -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt"
timeout ${BENCH_T:-330} python3 scripts/bench_kda_kernels.py --out "$OUT" $BENCH_ARGS 2>&1 | tee "$OUT/bench.log" | grep -v "^  sweep"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$CS" ]; then
  timeout ${SAN_T:-100} "$CS" --tool memcheck --print-limit 20 python3 scripts/bench_kda_kernels.py --sanitize 2>&1 | tail -12 | tee "$OUT/memcheck.txt"
else
  echo "compute-sanitizer not found" | tee "$OUT/memcheck.txt"
fi
