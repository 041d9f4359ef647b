#!/usr/bin/env bash
# run38 (2026-11-30, session 5, final code): compute-sanitizer memcheck of the kernel bench's correctness
# run and the compiled-plan step bench at M = 1..16; run after staging the wheels (see run_gpu.sh), with
# PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 100 "$CS" --tool memcheck --print-limit 20 python3 scripts/bench_kda_kernels.py --sanitize > $OUT/memcheck.txt 2>&1; echo rc=$? >> $OUT/memcheck.txt
timeout 120 python3 scripts/bench_kda_step.py --tuning results/tuning/2026-11-30_h200_k3_kda_projection.json --out $OUT/s > $OUT/step.log 2>&1; echo rc=$? >> $OUT/step.log
