"""`planner tune` and `planner bench` (GPU only; both exit 2 with a clear message without one).

    planner tune PLAN [--set k=v] [-o FILE] [--buckets 1,2,4,8] [--max-configs N]
                 [--iters N --trials N --sets N] [--no-variants] [--min-gain F] [--no-flashinfer]
    planner bench PLAN [--set k=v] [--tokens 1,2,4..8] [--tuning FILE] [--world-size N]
                  [--iters N --trials N --sets N] [--out DIR] [--emit text|json]

tune writes the tuning file read by `planner compile --tuning` and build_executor
(executors.tune documents the format); bench prints compiled vs unfused reference vs floor.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register"]


def _gpu_or_exit() -> bool:
    try:
        import torch
    except ImportError:
        print("planner: this command needs torch and a CUDA GPU", file=sys.stderr)
        return False
    if not torch.cuda.is_available():
        print("planner: this command times kernels and needs a CUDA GPU (none found)", file=sys.stderr)
        return False
    return True


def _tune(args) -> int:
    from planner.loader import parse_overrides

    from .bench import parse_tokens
    from .tune import save_tuning, tune_plan
    overrides = parse_overrides(args.overrides)
    from planner.loader import load_plan
    load_plan(args.plan, overrides)  # plan errors exit 2 before anything else
    if not _gpu_or_exit():
        return 2
    res = tune_plan(args.plan, overrides, dim=args.dim, buckets=parse_tokens(args.buckets, []) or None,
                    max_configs=args.max_configs, iters=args.iters, trials=args.trials, nsets=args.sets,
                    variants=not args.no_variants, min_gain=args.min_gain, flashinfer=not args.no_flashinfer,
                    budget_s=args.budget_s, refine=not args.no_refine)
    if args.output:
        save_tuning(res, args.output)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(json.dumps(res, indent=1))
    print("limits: " + (", ".join(f"{k}={v}" for k, v in res["limits"].items()) or "(none)"), file=sys.stderr)
    return 0


def _bench(args) -> int:
    from planner.loader import load_plan, parse_overrides

    from .bench import BENCH_COLS, bench_plan, parse_tokens, write_report
    overrides = parse_overrides(args.overrides)
    plan = load_plan(args.plan, overrides)
    dim = "num_tokens" if "num_tokens" in plan.dims else next(iter(plan.dims), None)
    tokens = parse_tokens(args.tokens, plan.dims[dim].buckets if dim else [])
    sizes = sorted({s for s in plan.groups.values() if s > 1})
    world = args.world_size or (sizes[0] if len(sizes) == 1 else 1)
    if not _gpu_or_exit():
        return 2
    res = bench_plan(args.plan, overrides, tokens, tuning=args.tuning, world=world, iters=args.iters,
                     trials=args.trials, nsets=args.sets)
    meta = {k: v for k, v in res.items() if k != "rows"}
    table = write_report(args.out, f"bench_{plan.name}", meta, res["rows"], BENCH_COLS,
                         f"planner bench {plan.name} ({res.get('device')}, world {world})")
    if args.emit == "json":
        print(json.dumps(res, indent=1, default=str))
    else:
        print(table)
    return 0 if all(r["ok"] for r in res["rows"]) else 1


def register(sub) -> None:
    from planner.commands import add_plan_args
    t = sub.add_parser("tune", help="time gemm backends/configs and region variants per bucket on this GPU;"
                                    " write a tuning file", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_args(t)
    t.add_argument("-o", "--output", metavar="FILE", help="write the tuning JSON here (default: stdout)")
    t.add_argument("--dim", default="num_tokens", help="the dynamic dim whose buckets are tuned")
    t.add_argument("--buckets", metavar="LIST", help="override the dim's buckets, e.g. 1,2,4..8")
    t.add_argument("--max-configs", type=int, default=24, help="cute configs timed per shape (default 24)")
    t.add_argument("--iters", type=int, default=20, help="steps per captured graph (default 20)")
    t.add_argument("--trials", type=int, default=5, help="replays per candidate, median (default 5)")
    t.add_argument("--sets", type=int, default=4, help="weight sets rotated against L2 (default 4)")
    t.add_argument("--no-variants", action="store_true", help="skip the end-to-end variant timing (no limits)")
    t.add_argument("--min-gain", type=float, default=0.0, help="a variant must win by this fraction (default 0)")
    t.add_argument("--no-flashinfer", action="store_true", help="do not time FlashInfer backends")
    t.add_argument("--no-refine", action="store_true",
                   help="keep the standalone winners (no end-to-end switch to the second choice per variant)")
    t.add_argument("--budget-s", type=float, default=None,
                   help="after this many seconds, remaining shapes time only torch and the default config")
    t.set_defaults(handler=_tune)

    b = sub.add_parser("bench", help="time the compiled plan vs its unfused reference and the floor (GPU)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_args(b)
    b.add_argument("--tokens", metavar="LIST", help="values of the dynamic dim (default: its buckets)")
    b.add_argument("--tuning", metavar="FILE", help="tuning file from `planner tune`")
    b.add_argument("--world-size", type=int, default=None, help="ranks (default: the plan's group size)")
    b.add_argument("--iters", type=int, default=20)
    b.add_argument("--trials", type=int, default=5)
    b.add_argument("--sets", type=int, default=4)
    b.add_argument("--out", metavar="DIR", help="write bench_<plan>.json/.csv/.md here")
    b.add_argument("--emit", choices=["text", "json"], default="text")
    b.set_defaults(handler=_bench)
