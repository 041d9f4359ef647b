#!/usr/bin/env bash
# run59 (2026-11-30, session 8): two variant sweeps at M = 1, 4, 8, 9, 12, 14, 16 of the m_tile-16 fused kernel with
# g1 stored as bf16x2 pairs or 16-byte chunks staged in shared memory (Config.gst 1 / 2) and out stored 4
# columns per thread (Config.ost), at both m_tiles, against the defaults, every candidate checked against an fp32 reference first. Run after staging the wheels
# (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for r in a b; do
timeout 250 python3 scripts/bench_kda_kernels.py --variant-sweep --ms 1,4,8,9,12,14,16 --out $OUT/$r > $OUT/vsweep_$r.log 2>&1; echo rc=$? >> $OUT/vsweep_$r.log
done
