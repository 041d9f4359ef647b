#!/usr/bin/env bash
# Nsight Compute on one launch of the fp8 skinny GEMM per shape (issue 20, diagnostics): speed of
# light, warp stall reasons, pipe use, memory workload; clocks left alone (--clock-control none).
#   SHAPES="6144x7168x8 6144x7168x16" [KINDS="block,block tensor,tensor"] bash scripts/gpu/fp8_ncu.sh
#   CONFIG='{"wg": true, ...}' TAG=wg ...   one config (Fp8Config fields) instead of each default
#   NCU_ARGS='--metrics regex:...'           more ncu options (e.g. the per-reason stall metrics)
# Writes $OUT/fp8_gemm/<RECORD>_ncu_<N>x<K>x<M>[_TAG].txt per shape and _nvidia_smi.txt.
. "$(dirname "$0")/common.sh"
smi fp8_gemm
for s in ${SHAPES:-6144x7168x8 6144x7168x16 4608x7168x8}; do
 for kinds in ${KINDS:-block,block}; do
  IFS=x read -r n k m <<< "$s"
  tag=$s; [ "$kinds" = block,block ] || tag="${s}_${kinds/,/x}"
  tag=$tag${TAG:+_$TAG}
  f=$(record fp8_gemm "ncu_${tag}.txt")
  timeout "${NCU_T:-150}" ncu --clock-control none --kernel-name regex:kernel_cutlass --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section SchedulerStats \
    --section InstructionStats ${NCU_ARGS:-} \
    python3 scripts/fp8_kernel_once.py --n "$n" --k "$k" --m "$m" --kinds "$kinds" ${CONFIG:+--config "$CONFIG"} > "$f" 2>&1
  echo "rc=$?" >> "$f"
  grep -E "rel err|DRAM Throughput|Memory Throughput|Duration|Issue Slots Busy|No Eligible|Achieved Occupancy|Registers Per|Stall|One or More" "$f" | head -30
 done
done
