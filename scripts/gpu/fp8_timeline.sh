#!/usr/bin/env bash
# Per-block timeline of the fp8 decode GEMM in graph replay (issue 20 diagnostics): when each
# call's blocks start, pass the PDL wait and end relative to the call before, for the shipped
# configs and their no-PDL / early-launch / L2-prefetch variants (scripts/fp8_timeline.py).
#   bash scripts/gpu/fp8_timeline.sh            SHAPES=dsv3_qkv_a,... MS=8,16 to narrow it
#   CONFIGS=FILE (one JSON case per line, see the script) adds cases; alone, only those run
# Precompile here first: CUTE_DSL_ARCH=sm_90a PLANNER_CACHE_DIR=.planner_cache python scripts/fp8_timeline.py --precompile
# Writes $OUT/fp8_gemm/<RECORD>_fp8_timeline.{json,log} and _nvidia_smi.txt (3 files).
. "$(dirname "$0")/common.sh"
smi fp8_gemm
log=$(record fp8_gemm fp8_timeline.log)
extra=()
if [ -n "${CONFIGS:-}" ]; then while IFS= read -r line; do [ -n "$line" ] && extra+=(--config "$line"); done < "$CONFIGS"; fi
timeout "${BENCH_T:-300}" python3 scripts/fp8_timeline.py --ms "${MS:-8,16}" ${SHAPES:+--shapes "$SHAPES"} "${extra[@]}" \
  --out "$(record fp8_gemm fp8_timeline.json)" > "$log" 2>&1; echo "rc=$?" >> "$log"
tail -60 "$log"
