#!/usr/bin/env bash
# Session 9 (2026-11-30) on nvidia-h200-x2, at the final code (kernel source split into ptx.py / kernels.py /
# fused.py): the one-GPU pytest suite plus the 2-GPU p2p tests, the SP tail gather bench twice (7 and 11
# trials) and `planner bench` of the SP tail plan at TP2. Run after staging the wheels (see
# ../kda_kernels/run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set. Few files come back: the benches
# write to /tmp and their tables are appended to the logs.
# (x2 was not lent at 11:45 UTC; run at ~11:55 UTC on GPU-f49f4a00 + GPU-21b18948: ../sp_gather/2026-11-30_h200x2_session9_*)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/s9
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,uuid,driver_version --format=csv,noheader > $OUT/gpu.txt
timeout 200 python3 -m pytest -q -m gpu tests/test_cute_kernels.py tests/test_gemm_chain.py tests/test_executor_gpu.py \
  tests/test_strided_add.py tests/test_p2p_gather.py -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo rc=$? >> $OUT/pytest_gpu.txt
timeout 100 python3 scripts/bench_sp_gather.py --stem sp_gather_tp2_s9 --out /tmp/s9/a > $OUT/sp_a.log 2>&1; echo rc=$? >> $OUT/sp_a.log
cat /tmp/s9/a/*.md >> $OUT/sp_a.log 2>/dev/null; cp /tmp/s9/a/*.json $OUT/sp_a.json 2>/dev/null
timeout 100 python3 scripts/bench_sp_gather.py --trials 11 --stem sp_gather_tp2_s9_rep2 --out /tmp/s9/b > $OUT/sp_b.log 2>&1; echo rc=$? >> $OUT/sp_b.log
cat /tmp/s9/b/*.md >> $OUT/sp_b.log 2>/dev/null
timeout 120 python3 -m planner.cli bench plans/k3_sp_tail.yaml --set tp_size=2 --world-size 2 --tokens 8,256,1024,4096 \
  --out /tmp/s9/pb > $OUT/planner_bench_sp.log 2>&1; echo rc=$? >> $OUT/planner_bench_sp.log
cat /tmp/s9/pb/*.md >> $OUT/planner_bench_sp.log 2>/dev/null
