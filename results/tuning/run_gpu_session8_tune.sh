#!/usr/bin/env bash
# Session 8 (2026-11-30): `planner tune` again, now that every bucket's variants are timed at both ends
# of the M range it serves (executors.tune.bucket_probes), then the compiled-plan step bench and the
# forced two-branch probe with the new file. Run after staging the wheels (see ../kda_kernels/run_gpu.sh),
# with PYTHONPATH and PLANNER_CACHE_DIR set (the tune candidates precompiled by
# precompile_tune_candidates.py plans/k3_kda_projection.yaml 8).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/full
export PYTHONUNBUFFERED=1
timeout 200 python3 -m planner.cli tune plans/k3_kda_projection.yaml -o $OUT/tuning_kda.json --max-configs 8 --budget-s 80 > $OUT/tune.log 2>&1; echo rc=$? >> $OUT/tune.log
timeout 100 python3 scripts/bench_kda_step.py --tuning $OUT/tuning_kda.json --out /tmp/full/s > $OUT/step.log 2>&1; echo rc=$? >> $OUT/step.log
TUNING=$OUT/tuning_kda.json timeout 100 python3 results/kda_step/probe_two_branch.py 12,13,15,16 2>&1 | grep -v "UserWarning\|_warn_once" > $OUT/probe.log; echo rc=$? >> $OUT/probe.log
