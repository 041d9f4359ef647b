#!/usr/bin/env bash
# run8: variant sweep (consumer passes) + GPU pytest (fused) + bench table + memcheck,
# after staging the wheels (see run_gpu.sh), PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/nvidia_smi.txt
timeout 120 python3 scripts/bench_kda_kernels.py --variant-sweep --out $OUT > $OUT/vsweep.log 2>&1; echo rc=$? >> $OUT/vsweep.log
timeout 90 python3 -m pytest -q -x -m gpu tests/test_cute_kernels.py -k fused -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
timeout 150 python3 scripts/bench_kda_kernels.py --no-sweep --out $OUT > $OUT/bench.log 2>&1; echo rc=$? >> $OUT/bench.log
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 80 "$CS" --tool memcheck --print-limit 20 python3 scripts/bench_kda_kernels.py --sanitize > $OUT/memcheck.txt 2>&1; echo rc=$? >> $OUT/memcheck.txt
