#!/usr/bin/env bash
# run29 (2026-11-30, session 5): K interleaved across the warps of a block (Config.ki) - variant
# sweep (own correctness checks first) and the fused-kernel GPU tests; run after staging the
# wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/nvidia_smi.txt
timeout 250 python3 scripts/bench_kda_kernels.py --variant-sweep --out $OUT > $OUT/vsweep.log 2>&1; echo rc=$? >> $OUT/vsweep.log
timeout 120 python3 -m pytest -q -x -m gpu tests/test_cute_kernels.py -k "tagged or fused_step or graph_side or warps_n" -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
