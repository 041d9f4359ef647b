#!/usr/bin/env bash
# SP tail gathers on two GPUs, TP2 (claims: results/sp_gather_tp2.md, results/zero_copy_packing.md):
# scripts/bench_sp_gather.py with 7 and 11 trials (4 separate gathers, the seed's cat + 1 gather +
# split, the compiled plan on the p2p gather and on NCCL, zero-copy vs cat packing with add producers,
# the NVLink peer-copy floor; every path bit-exact against list all_gather + cat first), `planner
# bench` of plans/k3_sp_tail.yaml at TP2, and the strided add microbench (GPU 0).
#   bash scripts/gpu/sp_gather_tp2.sh
# Writes $OUT/sp_gather_tp2/<RECORD>_{sp_gather_a.log,sp_gather_a.json,sp_gather_b.log,
# planner_bench_sp_tail.log,nvidia_smi.txt} and $OUT/zero_copy_packing/<RECORD>_strided_add.{log,json}
# (7 files).
. "$(dirname "$0")/common.sh"
[ "$NGPU" -ge 2 ] || { echo "sp_gather_tp2.sh needs two GPUs, found $NGPU" >&2; exit 2; }
smi sp_gather_tp2
trials=(7 11)
for i in 0 1; do
  r=$([ $i = 0 ] && echo a || echo b)
  log=$(record sp_gather_tp2 "sp_gather_$r.log")
  timeout "${SP_T:-150}" python3 scripts/bench_sp_gather.py --world-size 2 --trials "${trials[$i]}" \
    --stem "${RECORD}_sp_gather_$r" --out /tmp/sp_gather > "$log" 2>&1; echo "rc=$?" >> "$log"
  tail -2 "$log"
done
cp "/tmp/sp_gather/${RECORD}_sp_gather_a.json" "$(record sp_gather_tp2 sp_gather_a.json)"
log=$(record sp_gather_tp2 planner_bench_sp_tail.log)
timeout "${PB_T:-150}" python3 -m planner bench plans/k3_sp_tail.yaml --set tp_size=2 --world-size 2 \
  --tokens 8,256,1024,4096 --out /tmp/sp_pb > "$log" 2>&1; echo "rc=$?" >> "$log"
cat /tmp/sp_pb/*.md >> "$log" 2>/dev/null
tail -7 "$log"
log=$(record zero_copy_packing strided_add.log)
timeout "${ADD_T:-120}" python3 scripts/bench_strided_add.py --out /tmp/strided_add > "$log" 2>&1; echo "rc=$?" >> "$log"
cp /tmp/strided_add/bench_strided_add.json "$(record zero_copy_packing strided_add.json)"
tail -5 "$log"
