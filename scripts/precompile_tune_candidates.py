"""Compile, without a GPU, every CuTe config that `planner tune PLAN --max-configs N` will time
(the same candidate list as executors.tools.tune.gemm_candidates) into $PLANNER_CACHE_DIR, so that the
tune on the GPU machine loads its kernels from the carried disk cache instead of compiling there.

    CUTE_DSL_ARCH=sm_90a PLANNER_CACHE_DIR=.planner_cache \\
        python3 scripts/precompile_tune_candidates.py plans/k3_kda_projection.yaml 8

Run from the repository root with the project installed (setup.sh) or on PYTHONPATH.
"""

import sys

import executors.cute as ec
from executors.cute.config import configs_for, kind_for
from executors.tools.tune import plan_gemms
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan


def main(path: str, max_configs: int) -> None:
    plan = load_plan(path, {})
    sigs = plan_gemms(compile_plan(plan), "num_tokens", sorted(plan.dims["num_tokens"].buckets))
    done = 0
    for _sig, (dtype, m, n, k) in sorted(sigs.items()):
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


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: precompile_tune_candidates.py PLAN [MAX_CONFIGS]")
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 24)
