#!/usr/bin/env bash
# The CuTe DSL fp8 decode GEMM on one GPU (issue 20; record it as results/fp8_gemm.md): DeepSeek-V3 TP8 and KDA
# shapes, M = 1..16, against the fp8 HBM floor, torch._scaled_mm and the bf16 CuTe kernel; every
# path checked against an fp32 reference of the dequantized operands with poisoned outputs first.
#   bash scripts/gpu/fp8_gemm.sh                 config sweep at M = 8, 16, then the table (fp8_tuned
#                                                = the sweep's best per M bucket)
#   SWEEP=grid bash scripts/gpu/fp8_gemm.sh      the sweep over fp8_config_grid's combinations
#   MODE=table bash scripts/gpu/fp8_gemm.sh      the table with the default configs only
#   SWEEP_KINDS=tensor bash scripts/gpu/fp8_gemm.sh   the sweep with per-tensor scales (MEASURED_TENSOR)
#   SWEEP=bulk bash scripts/gpu/fp8_gemm.sh      the sweep over fp8_bulk_grid's bulk-copy rings
#   SHAPES=dsv3_qkv_a,kda_qkvg MS=1,8,16 ...     only these shapes / M values
#   ITERS=100 ...                                calls per timed graph (default 20; the records are
#                                                then named ..._fp8_gemm_iters100.*)
# Precompile here first (CPU, same tree as carried):
#   CUTE_DSL_ARCH=sm_90a PLANNER_CACHE_DIR=.planner_cache python scripts/bench_fp8_gemm.py --precompile --sweep ${SWEEP:-near} --jobs 2
# Without a carried cache the script compiles in JOBS (12) processes on the GPU machine first.
# Writes $OUT/fp8_gemm/<RECORD>_fp8_gemm.{md,json,log} and _nvidia_smi.txt (4 files).
. "$(dirname "$0")/common.sh"
smi fp8_gemm
md=$(record fp8_gemm fp8_gemm${ITERS:+_iters$ITERS}.md)
log=$(record fp8_gemm fp8_gemm${ITERS:+_iters$ITERS}.log)
sweep="--sweep ${SWEEP:-near} --sweep-kinds ${SWEEP_KINDS:-block}"
[ "${MODE:-sweep}" = table ] && sweep=
timeout "${BENCH_T:-560}" python3 scripts/bench_fp8_gemm.py $sweep --jobs "${JOBS:-12}" ${MS:+--ms "$MS"} ${SHAPES:+--shapes "$SHAPES"} ${ITERS:+--iters "$ITERS"} \
  --out "$md" > "$log" 2>&1; echo "rc=$?" >> "$log"
tail -30 "$log"
