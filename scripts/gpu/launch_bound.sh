#!/usr/bin/env bash
# What a kernel launched like the fp8 GEMM can reach (issue 20): per fp8 bench shape, the idle
# dependent kernel, the best weight-streaming kernel and the shipped fp8 GEMM at M = 1, 8, 16, in
# one run against the same HBM floor; each kernel checked before it is timed.
#   bash scripts/gpu/launch_bound.sh               all 11 shapes
#   SHAPES=dsv3_q_b,dsv3_qkv_a ...                 only these
#   ROWS=1,8 ...                                   also the GEMM lanes' load pattern (precompile with --rows 1,8)
# Precompile here first (CPU, same tree as carried):
#   CUTE_DSL_ARCH=sm_90a PLANNER_CACHE_DIR=.planner_cache python scripts/bench_launch_bound.py --precompile
# Writes $OUT/fp8_gemm/<RECORD>_launch_bound.{md,json,log} and _nvidia_smi.txt.
. "$(dirname "$0")/common.sh"
smi fp8_gemm
md=$(record fp8_gemm launch_bound.md)
log=$(record fp8_gemm launch_bound.log)
timeout "${BENCH_T:-500}" python3 scripts/bench_launch_bound.py ${SHAPES:+--shapes "$SHAPES"} ${ITERS:+--iters "$ITERS"} ${ROWS:+--rows "$ROWS"} \
  --out "$md" > "$log" 2>&1; echo "rc=$?" >> "$log"
tail -30 "$log"
