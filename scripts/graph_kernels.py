#!/usr/bin/env python3
"""Which kernels each KDA-step path puts into its CUDA graph (diagnostics, needs a GPU).

bench_kda_step times the compiled plan, the same plan with its region forced to the packed
variant, and kda_fused_step called directly; they should launch the same kernels. This
captures `--iters` steps of each path the way time_graphs does, replays the graph under
torch.profiler and prints, per path, the kernels of one replay in launch order with their
GPU times, plus the graph's wall time per step, so a path that launches more (a copy, a
second GEMM) or loses the PDL overlap shows up. Usage:
    python scripts/graph_kernels.py --tuning results/tuning/X.json [--ms 4,9]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch
from bench_kda_step import KDA, NSETS, REGION, Problem, Shapes

from executors.tools.timing import capture_steps, time_graphs
from executors.tools.tune import ForcedGate, load_tuning, tuned_executor
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan

ROOT = Path(__file__).resolve().parent.parent


def kernels_of(g, iters):
    """[(name, us)] of one replay, and the replay's wall time per step (us)."""
    g.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    evs.sort(key=lambda e: e.time_range.start)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    g.replay()
    e1.record()
    e1.synchronize()
    return [(e.name, e.time_range.elapsed_us()) for e in evs], e0.elapsed_time(e1) * 1000.0 / iters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tuning")
    ap.add_argument("--ms", default="4,9")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--time", type=int, default=0, metavar="TRIALS",
                    help="also time the paths (time_graphs, 20 steps) plus `kernel_alloc` (outputs "
                         "allocated in every call, as the gemm-chain step does) over TRIALS trials")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("graph_kernels: needs a CUDA GPU", file=sys.stderr)
        return 2
    from executors import cute

    dev = torch.device("cuda", torch.cuda.current_device())
    shp = Shapes(load_plan(KDA, {}))
    tuning = load_tuning(a.tuning) if a.tuning else None
    gen = torch.Generator().manual_seed(0)
    for m in (int(v) for v in a.ms.split(",")):
        p = Problem(m, shp, dev, gen)
        exs = [tuned_executor(compile_plan(load_plan(KDA, {})), {"w_packed": p.wp[j], "w_fb": p.wfb[j]},
                              tuning, device=dev) for j in range(NSETS)]

        def forced(i, exs=exs, p=p):
            ex = exs[i % NSETS]
            saved = ex._gates[REGION]
            ex._gates[REGION] = ForcedGate(REGION, "packed", ["two_branch", "packed"])
            try:
                return ex(x=p.x)
            finally:
                ex._gates[REGION] = saved

        fns = {"compiled": lambda i, exs=exs, p=p: exs[i % NSETS](x=p.x), "forced_packed": forced,
               "kernel": lambda i, p=p: cute.kda_fused_step(p.x, p.wp[i % NSETS], p.wfb[i % NSETS], p.y[i % NSETS],
                                                            p.g1[i % NSETS], fa_col=shp.NQ)}
        for name, f in fns.items():
            g = capture_steps(f, a.iters, 2, NSETS)
            ks, per_step = kernels_of(g, a.iters)
            counts = Counter(n[:60] for n, _ in ks)
            print(f"M={m} {name}: {len(ks)} kernels per {a.iters} steps, {per_step:.2f} us/step (one replay)")
            for n, c in counts.items():
                us = [t for k, t in ks if k[:60] == n]
                print(f"    {c:3d} x {n:60s} median {sorted(us)[len(us) // 2]:.2f} us")
            del g
        print(f"M={m} variants: {exs[0].last_variants}  backends: {dict(exs[0].backends)}", flush=True)
        if a.time:
            def kernel_alloc(i, p=p, m=m):
                j = i % NSETS
                o = torch.empty(m, shp.NP, device=dev, dtype=torch.bfloat16)
                g1 = torch.empty(m, shp.hc, device=dev, dtype=torch.bfloat16)
                return cute.kda_fused_step(p.x, p.wp[j], p.wfb[j], o, g1, fa_col=shp.NQ)
            t = time_graphs({**fns, "kernel_alloc": kernel_alloc}, iters=20, trials=a.time, nsets=NSETS)
            print(f"M={m} us/step over {a.time} trials: " + "  ".join(f"{k} {v:.2f}" for k, v in t.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
