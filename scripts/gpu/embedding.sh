#!/usr/bin/env bash
# The KDA executor embedded in a model on one GPU (docs/embedding.md): scripts/bench_embedding.py
# (torch.compile'd 4-layer module under reduce-overhead and a piecewise capture vs the bare
# executors in a graph, the previous prepack-copy build's kernel, the HBM floor, the shipped
# tuning vs the tuning file vs the plan's defaults, memory after building 8 layers; every path
# checked against an fp32 reference with poisoned outputs first).
#   bash scripts/gpu/embedding.sh
#   MODE=kernels bash scripts/gpu/embedding.sh   the kernels of one call per path (scripts/embedding_kernels.py)
# Writes $OUT/embedding/<RECORD>_{bench_embedding.log,embedding.json,nvidia_smi.txt} (3 files; the
# log ends with its table).
. "$(dirname "$0")/common.sh"
smi embedding
if [ "${MODE:-bench}" = kernels ]; then
  python3 scripts/embedding_kernels.py --ms "${MS:-1,8,16}" --out "$(record embedding kernels.txt)" 2>&1 | tail -60
  exit 0
fi
log=$(record embedding bench_embedding.log)
timeout "${EMB_T:-540}" python3 scripts/bench_embedding.py --stem "${RECORD}_embedding" --out /tmp/embedding \
  > "$log" 2>&1; echo "rc=$?" >> "$log"
cp "/tmp/embedding/${RECORD}_embedding.json" "$(record embedding embedding.json)" 2>/dev/null
tail -26 "$log"
