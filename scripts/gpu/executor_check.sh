#!/usr/bin/env bash
# The executor on GPUs (claim: results/executor_overhead.md): scripts/gpu_executor_check.py - the KDA
# plan eagerly, per-bucket CUDA graphs and inside a caller's capture, the two-branch overlap under
# replay (torch.profiler), graph replay vs a hand-captured graph of the same ops, and the SP tail plan
# on two GPUs over NCCL. CuTe DSL is left off the path (CUTE=0) so the compiled plan and the
# hand-captured graph run the same torch kernels.
#   bash scripts/gpu/executor_check.sh          (two GPUs for the SP part; one runs the KDA part)
# Writes $OUT/executor_overhead/<RECORD>_{executor_check.log,executor_check.json,
# kda_two_branch_replay_trace.json,kda_two_branch_eager_timeline.png,kda_two_branch_eager_timeline.svg,
# nvidia_smi.txt} (6 files).
CUTE=0 . "$(dirname "$0")/common.sh"
smi executor_overhead
log=$(record executor_overhead executor_check.log)
mkdir -p /tmp/executor_check
OUT=/tmp/executor_check timeout "${CHECK_T:-300}" python3 scripts/gpu_executor_check.py > "$log" 2>&1
echo "rc=$?" >> "$log"
cp /tmp/executor_check/gpu_executor_check.json "$(record executor_overhead executor_check.json)"
cp /tmp/executor_check/kda_two_branch_replay_trace.json "$(record executor_overhead kda_two_branch_replay_trace.json)"
for ext in png svg; do
  cp "/tmp/executor_check/kda_two_branch_timeline.$ext" "$(record executor_overhead "kda_two_branch_eager_timeline.$ext")" \
    2>/dev/null || echo "no $ext timeline (see the json)"
done
tail -20 "$log"
