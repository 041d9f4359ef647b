#!/usr/bin/env bash
# run52 (2026-11-30, session 7): x staged through shared memory by TMA bulk copies (Config.xs,
# executors/cute/xstage.py) in the swapped-role fused kernel at both m_tiles: two variant sweeps
# (every candidate checked against an fp32 reference first); the second only if the first ran
# (a wrong mbarrier protocol would hang, and timeout ends it). Run after staging the wheels (see
# run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,4,8,9,12,14,16 --out $OUT/a > $OUT/vsweep_a.log 2>&1; rc=$?; echo rc=$rc >> $OUT/vsweep_a.log
if [ $rc = 0 ]; then
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,4,8,9,12,14,16 --out $OUT/b > $OUT/vsweep_b.log 2>&1; echo rc=$? >> $OUT/vsweep_b.log
fi
