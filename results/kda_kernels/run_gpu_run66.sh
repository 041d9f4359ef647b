#!/usr/bin/env bash
# run66 (2026-11-30, session 9): run65 found ~1 us between thread 0's stamp after the consumers' barrier
# and their last mma at M = 16 (0.3 at M = 8, one polling warp). Per-block timelines of the m_tile-16
# default at M = 16 with the consumers' mid stamp after the barrier (dbg 1), after the last mma (dbg 2),
# when the second polling warp is done (dbg 4) and after the barrier once a shared load after it returned
# (dbg 5), twice (scripts/fused_timeline.py cases 30, 35, 39, 40). Run after staging the wheels (see
# run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 150 python3 scripts/fused_timeline.py --cases 30,35,39,40 --out /tmp/tl_$r > $OUT/timeline_$r.log 2>&1; echo rc=$? >> $OUT/timeline_$r.log
done
