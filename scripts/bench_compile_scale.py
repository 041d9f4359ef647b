"""How compile time grows with plan size: generated plans of 1k..100k ops.

Each plan is flat YAML (no loops, so parsing is measured too) made of layers that look
like real ones: a two-branch projection (independent GEMM chains), an opaque layer body,
a residual add, and every 8th layer a state that is all-gathered at the end (what
fuse-collectives packs). Prints load and compile seconds per size and the growth
exponent between sizes (1.0 = linear).

    python scripts/bench_compile_scale.py [--sizes 1000,10000,100000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from planner.lang.loader import load_plan
from planner.pipeline import compile_plan

OPS_PER_LAYER = 10


def generate(n_ops: int) -> str:
    layers = max(1, -(-n_ops * 8 // 73))  # 8 layers make 73 ops
    lines = ["plan: scale", "params: {hidden: 256, tp_size: 4}", "dims: {num_tokens: 1..4096}",
             "groups: {tp: tp_size}", "inputs:", "  h0: bf16[num_tokens, hidden]", "weights:"]
    for k in range(8):
        lines.append(f"  wa{k}: bf16[512, hidden]")
        lines.append(f"  wb{k}: bf16[64, hidden]")
        lines.append(f"  wc{k}: bf16[hidden, 64]")
    gathered = [i for i in range(layers) if i % 8 == 7]
    outs = [f"h{layers}"] + [f"g{i}" for i in gathered]
    lines.append(f"outputs: [{', '.join(outs)}]")
    lines.append("ops:")
    for i in range(layers):
        k = i % 8
        lines += [
            f"  - a{i}: gemm(h{i}, wa{k})",                       # branch 1
            f"  - b{i}: gemm(h{i}, wb{k})",                       # branch 2 ...
            f"  - c{i}, d{i}: split(b{i}, [32, 32])",
            f"  - e{i}: gemm(c{i}, wc{k}[:, :32])",               # ... F_B-like
            f"  - p{i}, q{i}: split(a{i}, [256, 256])",
            f"  - r{i}: add(p{i}, e{i})",
            f"  - s{i}: extern(layer_body, r{i}, q{i}, shape=[num_tokens, hidden], cost_us=40)",
            f"  - h{i + 1}: add(s{i}, h{i})",
        ]
        if i in gathered:
            lines.append(f"  - g{i}: all_gather(h{i + 1}, tp)[:num_tokens * tp_size]")
    return "\n".join(lines) + "\n"


def measure(n_ops: int, tmp: Path) -> dict:
    path = tmp / f"scale_{n_ops}.yaml"
    path.write_text(generate(n_ops))
    t0 = time.perf_counter()
    plan = load_plan(path)
    t1 = time.perf_counter()
    cp = compile_plan(plan)
    t2 = time.perf_counter()
    return {"target_ops": n_ops, "ops": len(plan.ops), "load_s": round(t1 - t0, 3), "compile_s": round(t2 - t1, 3),
            "total_s": round(t2 - t0, 3), "collectives_after": cp.report["fuse-collectives"]["after"],
            "streams": list(cp.streams)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,3000,10000,30000,100000")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        print(f"{'ops':>8} {'load s':>8} {'compile s':>10} {'total s':>8} {'growth':>7}  collectives after fusion")
        for n in sizes:
            r = measure(n, Path(d))
            if rows:
                p = rows[-1]
                r["growth_exponent"] = round(math.log(r["total_s"] / p["total_s"]) / math.log(r["ops"] / p["ops"]), 2)
            rows.append(r)
            g = f"{r.get('growth_exponent', ''):>7}"
            print(f"{r['ops']:>8} {r['load_s']:>8.2f} {r['compile_s']:>10.2f} {r['total_s']:>8.2f} {g}  "
                  f"{r['collectives_after']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
