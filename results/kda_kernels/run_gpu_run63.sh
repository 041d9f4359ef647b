#!/usr/bin/env bash
# run63 (2026-11-30, session 9): two variant sweeps at M = 1, 4, 8, 9, 12, 14, 16 of the fused defaults
# against the consumers' dry pass over their F_B code (Config.iw), every candidate checked against an
# fp32 reference first; then the per-block timeline of the m_tile-16 default at M = 16, 14 with and
# without iw (scripts/fused_timeline.py cases 30-33). Run after staging the wheels (see run_gpu.sh),
# with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 200 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,4,8,9,12,14,16 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
timeout 150 python3 scripts/fused_timeline.py --cases 30,31,32,33 --out /tmp/tl > $OUT/timeline.log 2>&1; echo rc=$? >> $OUT/timeline.log
# (after run63 the iw cases were dropped from fused_timeline.py: cases 30, 31 are now the default at
# M = 16, 14; iw itself is at commit 7bee194)
