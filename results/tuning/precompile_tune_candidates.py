"""Compile, without a GPU, every CuTe config that `planner tune PLAN --max-configs N` will time
(the same candidate list as executors.tune.gemm_candidates), into $PLANNER_CACHE_DIR, so the tune on
the GPU machine loads them from the carried disk cache. Usage (repo root):
    CUTE_DSL_ARCH=sm_90a PLANNER_CACHE_DIR=.planner_cache python3 results/tuning/precompile_tune_candidates.py \\
        plans/k3_kda_projection.yaml 8"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import executors.cute as ec  # noqa: E402
from executors.cute.config import configs_for, kind_for  # noqa: E402
from executors.tune import plan_gemms  # noqa: E402
from planner.lang.loader import load_plan  # noqa: E402
from planner.pipeline import compile_plan  # noqa: E402

path, max_configs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 24
plan = load_plan(path, {})
sigs = plan_gemms(compile_plan(plan), "num_tokens", sorted(plan.dims["num_tokens"].buckets))
done = 0
for sig, (dtype, m, n, k) in sorted(sigs.items()):
    if dtype != "bf16" or ec.supports(m, n, k, "bfloat16", k) is not None:
        continue
    seen = set()
    for c in [ec.default_config(m, n, k)] + configs_for(m, n, k, kind=kind_for(n, k)):
        if c.key() in seen or c.check(m, n, k) is not None:
            continue
        seen.add(c.key())
        ec.get_kernel(c, n, k, arch="sm_90a")
        done += 1
        if len(seen) >= max_configs:
            break
print(f"precompiled {done} tune candidates for {len(sigs)} signatures")
