#!/usr/bin/env bash
# run55 (2026-11-30, session 7): per-block timeline of the m_tile-16 default (swapped roles, minb 3) at
# M = 9, 16, 14 (scripts/fused_timeline.py cases 25-27), each with the blocks that end last and
# the other blocks on their SMs: why the step grows from M = 9 to 16. Run after staging the wheels
# (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 100 python3 scripts/fused_timeline.py --cases 25,26,27 --out /tmp/tl_$r > $OUT/timeline_$r.log 2>&1; echo rc=$? >> $OUT/timeline_$r.log
done
