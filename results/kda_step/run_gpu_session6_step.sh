#!/usr/bin/env bash
# Session 6 (2026-11-30): the compiled-plan KDA step bench twice and `planner bench`, after the HBM read
# bandwidth of the floor became the best of three medians (one median read 5 % low in final2 run a).
# Run after staging the wheels (see ../kda_kernels/run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/full
export PYTHONUNBUFFERED=1
T=${TUNING:-results/tuning/2026-11-30_h200_k3_kda_projection.json}  # (session 8: overridable)
for run in a b; do
  timeout 100 python3 scripts/bench_kda_step.py --tuning $T --out /tmp/full/$run > $OUT/step_$run.log 2>&1; echo rc=$? >> $OUT/step_$run.log
done
cp /tmp/full/a/kda_step.json $OUT/step_a.json
timeout 150 python3 -m planner.cli bench plans/k3_kda_projection.yaml --tuning $T --out /tmp/full/pb > $OUT/planner_bench.log 2>&1; echo rc=$? >> $OUT/planner_bench.log
cat /tmp/full/pb/*.md >> $OUT/planner_bench.log 2>/dev/null
