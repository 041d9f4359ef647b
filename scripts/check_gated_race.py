"""GPU check of the gated-region race: a region output read on the aux stream.

Compiles tests/plans/gated_race.yaml for one GPU (tp of size 1, the consumer pinned to
aux as assign-streams places it at TP2): region r3 makes g4 with a heavy gemm on main
(var0: gemm then copy, var1: gemm then add), t26/t27 read it on aux. Each variant is
forced through the tuned limit (lim = max tokens takes var0, lim = 0 takes var1) at
num_tokens = 4096, and 100 calls are made eagerly and 100 as CUDA-graph replays, each
with fresh random inputs and poisoned outputs, against an fp32 reference computed
from the same bf16 inputs. A call is wrong when its error exceeds the bf16 bound.
Then it times both variants under replay with CUDA events.

    python scripts/check_gated_race.py [--calls 100] [--tokens 4096] [--json out.json]

Exit 1 when any call is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import torch

from executors.lowering import build_executor
from planner.config import CompileConfig
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan

PLAN = ROOT / "tests" / "plans" / "gated_race.yaml"


def one_gpu_text() -> str:
    return PLAN.read_text().replace("tp_size: 2", "tp_size: 1").replace(
        "t26: shard(g4, tp)", "t26: shard(g4, tp, stream=aux)")


def _build(lim: int):
    cp = compile_plan(load_plan(PLAN, text=one_gpu_text()), CompileConfig())
    assert cp.graph.nodes["t26"]["stream"] == "aux"
    hidden = cp.plan.params["hidden"]
    g = torch.Generator(device="cuda").manual_seed(0)
    w = {n: (torch.randn(hidden, hidden, device="cuda", generator=g) / hidden ** 0.5).to(torch.bfloat16)
         for n in ("w", "w2")}
    return build_executor(cp, w, device="cuda", backend_prefs=("torch",), tuning={"lim": lim}), w


def _reference(x, w, variant):
    a = (x.float() @ w["w"].float().t()).to(torch.bfloat16)
    g4 = a if variant == "var0" else (a.float() + a.float()).to(torch.bfloat16)
    return g4.float() @ w["w2"].float().t()


def _bad(out, ref) -> tuple[bool, float]:
    err = float((out.float() - ref).abs().max())
    bound = 3e-2 * float(ref.abs().max()) + 1e-2
    return not (err <= bound), err  # NaN (a poisoned value read) counts as wrong


def run_calls(num_tokens: int, calls: int = 100, graphed: bool = False, variant: str | None = None):
    """-> (wrong calls, worst error, variant taken). variant None: the plan's own gate."""
    lim = {"var0": 1 << 30, "var1": 0, None: 16}[variant]
    ex, w = _build(lim)
    hidden = ex.plan.params["hidden"]
    b = {"num_tokens": num_tokens}
    x = torch.randn(num_tokens, hidden, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(num_tokens, hidden, device="cuda", dtype=torch.bfloat16)
    wrong, worst = 0, 0.0
    if graphed:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                ex(dims=b, x=x, y=y)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = ex(dims=b, x=x, y=y)
    taken = None
    for _ in range(calls):
        x.normal_()
        if graphed:
            outs["t27"].fill_(float("nan"))
            graph.replay()
        else:
            outs = ex(dims=b, x=x, y=y)
        taken = ex.last_variants["r3"]
        torch.cuda.synchronize()
        bad, err = _bad(outs["t27"], _reference(x, w, taken))
        wrong += bad
        worst = max(worst, err) if err == err else float("inf")
    return wrong, worst, taken


def time_replay(num_tokens: int, variant: str, iters: int = 50) -> float:
    ex, _ = _build({"var0": 1 << 30, "var1": 0}[variant])
    hidden = ex.plan.params["hidden"]
    b = {"num_tokens": num_tokens}
    x = torch.randn(num_tokens, hidden, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(num_tokens, hidden, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            ex(dims=b, x=x, y=y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ex(dims=b, x=x, y=y)
    for _ in range(5):
        graph.replay()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        graph.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / iters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("check_gated_race: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for variant in ("var0", "var1"):
        for graphed in (False, True):
            wrong, worst, taken = run_calls(args.tokens, args.calls, graphed, variant)
            rows.append({"variant": variant, "taken": taken, "mode": "graph replay" if graphed else "eager",
                         "calls": args.calls, "wrong": wrong, "max_abs_err": worst})
    times = {v: time_replay(args.tokens, v) for v in ("var0", "var1")}
    print(f"gated race check on {torch.cuda.get_device_name()} (num_tokens={args.tokens}, torch {torch.__version__})")
    print(f"{'variant':8} {'taken':6} {'mode':13} {'calls':>5} {'wrong':>5} {'max_abs_err':>12}")
    for r in rows:
        print(f"{r['variant']:8} {r['taken']:6} {r['mode']:13} {r['calls']:5d} {r['wrong']:5d} {r['max_abs_err']:12.4g}")
    print(f"replay us/call: var0 {times['var0']:.1f}, var1 {times['var1']:.1f} (var1/var0 {times['var1'] / times['var0']:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "replay_us": times}, indent=1))
    ok = all(r["wrong"] == 0 and r["taken"] == r["variant"] for r in rows)
    print("result:", "ok" if ok else "WRONG CALLS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
