#!/usr/bin/env bash
# `planner tune` of the KDA projection plan on one GPU (claim: results/gemm_backends.md): every GEMM
# signature and M bucket timed on torch, the CuTe configs (and FlashInfer's backends when staged),
# each candidate checked against fp32 first; then the variants end to end at both ends of each
# bucket, the gate limit derived from them. Precompile the candidates on the CPU first
# (scripts/gpu/README.md) or the tune spends its budget compiling.
#   bash scripts/gpu/kda_tune.sh
# Writes $OUT/gemm_backends/<RECORD>_{tuning_kda.json,planner_tune_kda.log,nvidia_smi.txt}; to ship a
# new tuning file, copy the JSON over the one scripts/gpu/kda_step.sh reads.
. "$(dirname "$0")/common.sh"
smi gemm_backends
log=$(record gemm_backends planner_tune_kda.log)
timeout "${TUNE_T:-300}" python3 -m planner tune plans/k3_kda_projection.yaml \
  -o "$(record gemm_backends tuning_kda.json)" --max-configs "${MAXC:-8}" --budget-s "${BUDGET:-80}" \
  > "$log" 2>&1; echo "rc=$?" >> "$log"
tail -20 "$log"
