#!/usr/bin/env bash
# run21 (2026-11-30): producer K split (pks = 7, knob only at commit 4e22246); run22: one fence per
# producer block; run23: tagged f_a handoff (tag); run24: tag + 3 consumer blocks; run25: m_tile-16 poll over two warps; run26: one poll per (row half, K step); run27: pin - variant sweep, GPU tests, per-block timeline; run after staging
# the wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/nvidia_smi.txt
timeout 150 python3 -m pytest -q -x -m gpu tests/test_cute_kernels.py -k "tagged or dbg or fused_step or graph_side or warps_n" -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
timeout 220 python3 scripts/bench_kda_kernels.py --variant-sweep --out $OUT > $OUT/vsweep.log 2>&1; echo rc=$? >> $OUT/vsweep.log
timeout 90 python3 scripts/fused_timeline.py --out $OUT > $OUT/timeline.log 2>&1; echo rc=$? >> $OUT/timeline.log
