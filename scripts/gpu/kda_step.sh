#!/usr/bin/env bash
# KDA decode step on one GPU (claim: results/kda_step.md): scripts/bench_kda_step.py twice (sequential
# packed torch.mm, the seed's two-stream torch.mm, the compiled plan with the tuning file, the plan
# forced to each variant, the fused kernel alone, the HBM floor; every path checked against an fp32
# reference first), then `planner bench` of plans/k3_kda_projection.yaml (compiled vs unfused).
#   bash scripts/gpu/kda_step.sh
#   TUNING=path/to/tuning.json bash scripts/gpu/kda_step.sh     # another tuning file
# Writes $OUT/kda_step/<RECORD>_{kda_step_a.log,kda_step_a.json,kda_step_b.log,planner_bench_kda.log,
# nvidia_smi.txt} (5 files; the logs end with their tables).
. "$(dirname "$0")/common.sh"
T=${TUNING:-results/tuning/2026-11-30_h200_k3_kda_projection_s8.json}
smi kda_step
for r in a b; do
  log=$(record kda_step "kda_step_$r.log")
  timeout "${STEP_T:-150}" python3 scripts/bench_kda_step.py --tuning "$T" --stem "${RECORD}_kda_step_$r" \
    --out /tmp/kda_step > "$log" 2>&1; echo "rc=$?" >> "$log"
  tail -2 "$log"
done
cp "/tmp/kda_step/${RECORD}_kda_step_a.json" "$(record kda_step kda_step_a.json)"
log=$(record kda_step planner_bench_kda.log)
timeout "${PB_T:-150}" python3 -m planner bench plans/k3_kda_projection.yaml --tuning "$T" --out /tmp/kda_pb \
  > "$log" 2>&1; echo "rc=$?" >> "$log"
cat /tmp/kda_pb/*.md >> "$log" 2>/dev/null
tail -9 "$log"
