#!/usr/bin/env bash
# Device driver for the perf work (nvidia-h200-x2). Two runs made back to back:
#   run 1 (carry .devstage/1 .whl):                  bash results/executor_gpu/run_gpu.sh 1
#   run 2 (carry .devstage/2 .whl .planner_cache):   bash results/executor_gpu/run_gpu.sh 2
# Run 1: stage cutlass part 1; SP gather bench on 2 GPUs (NCCL); executor GPU proof.
# Run 2: stage part 2 (installs cutlass-dsl); planner tune on the KDA plan (GPU 0);
#        KDA step bench with that tuning; planner bench (KDA; SP tail at TP2).
# Everything lands in $OUT/runN.tgz (the device returns at most 8 files) plus the log.
set -o pipefail
stage=${1:?stage 1 or 2}
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p "$R"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PLANNER_CACHE_DIR=$PWD/.planner_cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD:$PYTHONPATH
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$R/nvidia_smi_$stage.txt"
t0=$(date +%s)
if [ "$stage" = 1 ]; then
  bash .devstage/1/unstage.sh
  timeout ${SP_T:-150} python3 scripts/bench_sp_gather.py --out "$R" 2>&1 | tee "$R/sp_gather.log"
  echo "[run1] sp bench rc=$? at $(( $(date +%s) - t0 ))s"
  OUT=$R timeout ${CHECK_T:-150} python3 scripts/gpu_executor_check.py 2>&1 | tee "$R/gpu_executor_check.log"
  echo "[run1] executor check rc=$? at $(( $(date +%s) - t0 ))s"
else
  bash .devstage/2/unstage.sh || echo "[run2] cutlass NOT staged: tuning and benches run with torch backends only"
  python3 -c "import executors.cute as ec, torch; print('cute available', ec.available(), torch.__version__)"
  timeout ${TUNE_T:-150} python3 -m planner.cli tune plans/k3_kda_projection.yaml -o "$R/tuning_kda.json" \
    --max-configs ${MAXC:-8} --budget-s ${TUNE_BUDGET:-80} 2>&1 | tee "$R/tune.log"
  echo "[run2] tune rc=$? at $(( $(date +%s) - t0 ))s"
  T=$R/tuning_kda.json; [ -f "$T" ] || T=
  timeout ${KDA_T:-100} python3 scripts/bench_kda_step.py ${T:+--tuning $T} --out "$R" 2>&1 | tee "$R/kda_step.log"
  echo "[run2] kda step rc=$? at $(( $(date +%s) - t0 ))s"
  timeout ${PB_T:-60} python3 -m planner.cli bench plans/k3_kda_projection.yaml ${T:+--tuning $T} --out "$R" 2>&1 | tee "$R/bench_kda.log"
  [ -n "$PB_SP" ] && timeout ${PB_T:-60} python3 -m planner.cli bench plans/k3_sp_tail.yaml --set tp_size=2 --tokens 8,256,1024,4096 --out "$R" 2>&1 | tee "$R/bench_sp.log"
  echo "[run2] planner bench done at $(( $(date +%s) - t0 ))s"
fi
tar czf "$OUT/run$stage.tgz" -C "$OUT" r && rm -rf "$R"
ls -la "$OUT"
