#!/usr/bin/env bash
# run64 (2026-11-30, session 9): two variant sweeps at M = 1, 4, 8, 9, 12, 14, 16 of the fused defaults
# against fewer weight loads in flight (4 warps per block with 6 blocks/SM, or half the unroll), every
# candidate checked against an fp32 reference first; then the per-block timeline of the m_tile-16 default
# and its 4-warp variant at M = 16, and of both m_tile-8 kernels at M = 8 (scripts/fused_timeline.py
# cases 30, 32, 33, 34). Run after staging the wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,4,8,9,12,14,16 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
timeout 150 python3 scripts/fused_timeline.py --cases 30,32,33,34 --out /tmp/tl > $OUT/timeline.log 2>&1; echo rc=$? >> $OUT/timeline.log
