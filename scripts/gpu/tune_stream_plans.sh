#!/usr/bin/env bash
# Tunings of the DeepSeek-V3 stream plans on one GPU (issue 19): `planner tune` of
# plans/dsv3_mla_input_proj.yaml and plans/dsv3_moe_shared_expert.yaml with their model code
# (executors.tools.externs:model_externs), so every extern site is timed per bucket and the cost
# model rates the streams with measured model-code times.
#   bash scripts/gpu/tune_stream_plans.sh        (MAX_CONFIGS=8 BUDGET_S=120 by default)
#   PLANS="dsv3_moe_shared_expert" INSTALL=1 bash scripts/gpu/tune_stream_plans.sh
# Writes $OUT/tuning/<RECORD>_{<plan>.json,<plan>.log,nvidia_smi.txt}; INSTALL=1 also copies each
# tuning to planner/tuned/<date>_h200_<plan>.json here, so a bench in the same run compiles with it.
. "$(dirname "$0")/common.sh"
smi tuning
for plan in ${PLANS:-dsv3_mla_input_proj dsv3_moe_shared_expert}; do
  log=$(record tuning "$plan.log")
  out=$(record tuning "$plan.json")
  timeout "${TUNE_T:-280}" python3 -m planner tune "plans/$plan.yaml" --externs executors.tools.externs:model_externs \
    --max-configs "${MAX_CONFIGS:-8}" --budget-s "${BUDGET_S:-120}" -o "$out" > "$log" 2>&1
  echo "rc=$?" >> "$log"
  grep -E "extern:|limit|done|rc=" "$log" | tail -40
  if [ "${INSTALL:-0}" = 1 ] && [ -s "$out" ]; then
    cp "$out" "planner/tuned/$(date -u +%Y-%m-%d)_${model}_$plan.json" && echo "installed planner/tuned/$(date -u +%Y-%m-%d)_${model}_$plan.json"
  fi
done
