#!/usr/bin/env bash
# run65 (2026-11-30, session 9): where the m_tile-16 F_B consumers spend the 1-1.4 us after "f_a seen"
# (0.4 us at m_tile 8): per-block timelines of the defaults at M = 16 and 8 with the consumers' mid stamp
# after the barrier (dbg 1), after their last mma (dbg 2) or after their g1 stores are issued (dbg 3),
# twice (scripts/fused_timeline.py cases 30, 35, 36, 33, 37, 38). Run after staging the wheels (see
# run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 150 python3 scripts/fused_timeline.py --cases 30,35,36,33,37,38 --out /tmp/tl_$r > $OUT/timeline_$r.log 2>&1; echo rc=$? >> $OUT/timeline_$r.log
done
