#!/usr/bin/env python3
"""Which kernels the KDA executor's paths in a compiled model run per call (diagnostics, GPU).

bench_embedding times the bare executors in a torch.cuda.graph, the same 4-layer module under
torch.compile(mode="reduce-overhead") (CUDA graph trees) and a piecewise capture. This replays
one call of each under torch.profiler (CUDA activity) and prints, per path, every kernel and
memcpy/memset of the call in launch order with its GPU time and the gap before it, plus the
span from the first start to the last end, so a path that runs more work (a copy, a memset)
or loses the PDL overlap between consecutive kernels shows up. Usage:
    python scripts/embedding_kernels.py [--ms 1,8,16] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys

import torch
from bench_embedding import KDA, NSETS, Layers, capture, weight_sets

from executors import build_executor
from executors.tools.check import compile_for_run
from planner.lang.loader import load_plan


def activity(fn) -> list[tuple[str, float, float]]:
    """[(name, start us, duration us)] of the GPU work of one fn() (after a warm call)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    evs.sort(key=lambda e: e.time_range.start)
    if not evs:
        return []
    t0 = evs[0].time_range.start
    return [(e.name, e.time_range.start - t0, e.time_range.end - e.time_range.start) for e in evs]


def show(name: str, acts, out) -> None:
    if not acts:
        out(f"  {name}: no GPU activity recorded")
        return
    span = max(s + d for _, s, d in acts)
    busy = sum(d for _, _, d in acts)
    out(f"  {name}: {len(acts)} activities, span {span:.2f} us, busy {busy:.2f} us")
    end = 0.0
    for n, s, d in acts:
        out(f"    +{s - end:7.2f} gap  {d:7.2f} us  {n[:110]}")
        end = max(end, s + d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,8,16")
    ap.add_argument("--out", default=None, help="also write the listing to this file")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("embedding_kernels: needs a CUDA GPU", file=sys.stderr)
        return 1
    lines: list[str] = []

    def out(s):
        print(s, flush=True)
        lines.append(s)

    dev = torch.device("cuda", torch.cuda.current_device())
    plan = load_plan(KDA, {})
    ws = weight_sets(plan, dev, NSETS)
    exs = [build_executor(compile_for_run(plan), w, device=dev) for w in ws]
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    ro = torch.compile(Layers(exs), mode="reduce-overhead", fullgraph=True, dynamic=False)
    for m in (int(v) for v in a.ms.split(",")):
        x = torch.randn(m, plan.params["hidden"], device=dev).bfloat16()
        torch._dynamo.mark_static_address(x)
        g, _ = capture(Layers(exs), x.clone())
        for _ in range(3):
            ro(x)
        out(f"M={m} (4 KDA steps per call)")
        show("bare torch.cuda.graph replay", activity(g.replay), out)
        show("reduce-overhead call (x static)", activity(lambda x=x: ro(x)), out)
        out(f"  layout copies made by the op so far: {[e.op_layout_copies for e in exs]}")
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
