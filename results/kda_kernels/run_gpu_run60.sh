#!/usr/bin/env bash
# run60 (2026-11-30, session 8): two variant sweeps at M = 1, 4, 8, 9, 12, 14, 16 of the fused defaults
# (g1 in bf16x2 pairs) against the producers storing their tagged f_a pairs before out (Config.tf) and
# two consumer passes, every candidate checked against an fp32 reference first; then the per-block
# timeline of the m_tile-16 default at M = 16, 14 and of tf at 16 (scripts/fused_timeline.py cases
# 28-30). Run after staging the wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 250 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,4,8,9,12,14,16 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
timeout 120 python3 scripts/fused_timeline.py --cases 28,29,30 --out /tmp/tl > $OUT/timeline.log 2>&1; echo rc=$? >> $OUT/timeline.log
