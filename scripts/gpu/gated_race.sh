#!/usr/bin/env bash
# The gated-region race (correctness; issue: a region output read on aux waited only on the
# fallback's event): scripts/check_gated_race.py - tests/plans/gated_race.yaml on one GPU, each
# variant forced through its tuned limit at 4096 tokens, 100 eager calls and 100 CUDA-graph replays
# each with fresh inputs and poisoned outputs vs an fp32 reference; then the GPU test of the shape.
#   bash scripts/gpu/gated_race.sh
# Writes $OUT/gated_race/<RECORD>_{gated_race.log,gated_race.json,nvidia_smi.txt} (3 files).
CUTE=0 . "$(dirname "$0")/common.sh"
smi gated_race
log=$(record gated_race gated_race.log)
timeout "${CHECK_T:-300}" python3 scripts/check_gated_race.py --json "$(record gated_race gated_race.json)" > "$log" 2>&1
echo "rc=$?" >> "$log"
timeout 300 python3 -m pytest -q tests/test_gated_events.py -k gpu >> "$log" 2>&1
echo "pytest rc=$?" >> "$log"
tail -20 "$log"
