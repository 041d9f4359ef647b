#!/usr/bin/env bash
# Stream planning without pins on one GPU (issue 19): the DeepSeek-V3 MLA input projection and
# MoE shared-expert plans compiled as shipped vs serial vs every hand-pinned assignment, each
# bucket of num_tokens (scripts/bench_stream_plans.py; every path checked eagerly and under graph
# replay against an fp32 reference with poisoned outputs first).
#   bash scripts/gpu/stream_plans.sh            (TRIALS=31 by default)
# Writes $OUT/stream_plans/<RECORD>_{bench_stream_plans.log,dsv3_stream_plans.{md,json,csv},nvidia_smi.txt}.
. "$(dirname "$0")/common.sh"
smi stream_plans
log=$(record stream_plans bench_stream_plans.log)
timeout "${SP_T:-540}" python3 scripts/bench_stream_plans.py --trials "${TRIALS:-31}" --out /tmp/stream_plans \
  > "$log" 2>&1; echo "rc=$?" >> "$log"
for f in /tmp/stream_plans/*_dsv3_stream_plans.*; do
  [ -e "$f" ] && cp "$f" "$(record stream_plans "dsv3_stream_plans.${f##*.}")"
done
tail -24 "$log"
