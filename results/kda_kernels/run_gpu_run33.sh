#!/usr/bin/env bash
# run33 (2026-11-30, session 5): the tag epoch from fire-and-forget arrivals (now tag = 1) - fused-kernel
# GPU tests, variant sweep at M = 9..16 (where the m_tile-16 fused kernel beats two launches) and
# the timeline; run after staging the wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/nvidia_smi.txt
timeout 150 python3 -m pytest -q -x -m gpu tests/test_cute_kernels.py -k "tagged or fused_step or graph_side or warps_n or interleave" -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 9,10,11,12,13,14,15,16 --out $OUT/a > $OUT/vsweep_a.log 2>&1; echo rc=$? >> $OUT/vsweep_a.log
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,4,8,9,12,16 --out $OUT/b > $OUT/vsweep_b.log 2>&1; echo rc=$? >> $OUT/vsweep_b.log
timeout 90 python3 scripts/fused_timeline.py --cases 7,8,10,11 --out $OUT/tl > $OUT/timeline.log 2>&1; echo rc=$? >> $OUT/timeline.log
