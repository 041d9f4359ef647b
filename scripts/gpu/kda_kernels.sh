#!/usr/bin/env bash
# The CuTe DSL KDA kernels on one GPU (claim: results/kda_kernels.md; every candidate checked against
# an fp32 reference with poisoned outputs before it is timed).
#   bash scripts/gpu/kda_kernels.sh                       kernel-level table (bench_kda_kernels.py --no-sweep)
#   MODE=sweep TOPIC=pwu MS=9,12,16 bash scripts/gpu/kda_kernels.sh
#                                     the VSWEEP_* candidates of scripts/bench_kda_kernels.py, two sweeps
#   MODE=timeline TOPIC=tail CASES=30,33 bash scripts/gpu/kda_kernels.sh
#                                     per-block %globaltimer timelines (scripts/fused_timeline.py), twice
# Writes $OUT/kda_kernels/<RECORD>_kda_kernels.{log,json}, _kda_sweep_<TOPIC>_{a,b}.log or
# _kda_timeline_<TOPIC>_{a,b}.log, and _nvidia_smi.txt (at most 3 files).
. "$(dirname "$0")/common.sh"
smi kda_kernels
case ${MODE:-table} in
  table)
    log=$(record kda_kernels kda_kernels.log)
    timeout "${BENCH_T:-300}" python3 scripts/bench_kda_kernels.py --no-sweep --out /tmp/kda_kernels \
      > "$log" 2>&1; echo "rc=$?" >> "$log"
    cp /tmp/kda_kernels/kda_bench.json "$(record kda_kernels kda_kernels.json)" ;;
  sweep)
    for r in a b; do
      log=$(record kda_kernels "kda_sweep_${TOPIC:-variants}_$r.log")
      timeout "${BENCH_T:-250}" python3 scripts/bench_kda_kernels.py --variant-sweep ${MS:+--ms "$MS"} \
        --out "/tmp/kda_sweep_$r" > "$log" 2>&1; echo "rc=$?" >> "$log"
    done ;;
  timeline)
    for r in a b; do
      log=$(record kda_kernels "kda_timeline_${TOPIC:-cases}_$r.log")
      timeout "${BENCH_T:-200}" python3 scripts/fused_timeline.py ${CASES:+--cases "$CASES"} \
        --out "/tmp/kda_timeline_$r" > "$log" 2>&1; echo "rc=$?" >> "$log"
    done ;;
  *) echo "MODE is table, sweep or timeline" >&2; exit 2 ;;
esac
tail -20 "$log"
