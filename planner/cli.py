"""`planner` command line: one argparse for every subcommand; handlers load lazily.

Exit codes: 0 ok, 2 invalid input (a PlanError or bad arguments), 1 failure.
A handler is named "module:function" and imported only when its subcommand runs, so
validate, compile and viz never import torch; run, tune and bench live in
executors.tools.commands.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from .errors import Loc, PlanError, no_gc
from .passes import PASS_NAMES
from .viz.render import FORMATS

__all__ = ["main", "build_parser"]

RUN_EPILOG = """Inputs and weights are seeded random tensors; externs the plan calls are deterministic
stand-ins (executors.tools.externs). With --check every output is compared with the unfused
single-stream plan: bit-exact for data movement, allclose where arithmetic is involved."""



def _seconds(text: str) -> float:
    """A --timeout: a finite number of seconds > 0."""
    import math
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got '{text}'") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return v

def _color() -> bool:
    return sys.stderr.isatty() and os.environ.get("NO_COLOR") is None


def print_plan_error(err: PlanError, emit: str = "text") -> None:
    if emit == "json":
        print(json.dumps({"ok": False, "errors": [d.to_json() for d in err.diagnostics]}, indent=2))
        return
    for d in err.diagnostics:
        text = d.format()
        if _color():
            text = text.replace("error[", "\033[1;31merror\033[0m[", 1)
        print(text, file=sys.stderr)


class _Usage(Exception):
    """Bad usage found by argparse (exit 2, which matches our contract)."""

    def __init__(self, parser, message: str):
        super().__init__(message)
        self.parser, self.message = parser, message


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Usage(self, message)


def _wants_json(argv: list[str]) -> bool:
    """--emit json among the arguments, read without the parser (which is what just failed); as the
    parser does, a prefix of --emit (--e, --em, --emi) counts."""
    def emit(flag: str) -> bool:
        return len(flag) >= 3 and "--emit".startswith(flag)
    for i, a in enumerate(argv):
        flag, eq, value = a.partition("=")
        if emit(flag) and (value == "json" if eq else i + 1 < len(argv) and argv[i + 1] == "json"):
            return True
    return False


def _usage_error(exc: _Usage, argv: list[str]) -> int:
    if _wants_json(argv):
        print_plan_error(PlanError.at(None, "param", exc.message), "json")
    else:
        exc.parser.print_usage(sys.stderr)
        print(f"planner: error: {exc.message}", file=sys.stderr)
    return 2


def _plan_args(p) -> None:
    p.add_argument("plan", help="plan file (YAML)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                   help="override a param, e.g. --set tp_size=4 (repeatable)")


def _compile_args(p) -> None:
    p.add_argument("--disable-pass", action="append", default=[], metavar="NAME",
                   help=f"skip a pass ({', '.join(PASS_NAMES)})")
    p.add_argument("--streams", type=int, default=None,
                   help="stream bound: main + N-1 shared aux; pins beyond it fold onto main (default: the plan's"
                        " streams: list, or main + aux and every aux<N> the plan pins)")
    p.add_argument("--bucket-cap-mb", type=float, default=512.0, help="byte cap of one fused collective, MB > 0 (default 512)")
    p.add_argument("--packing", choices=["auto", "cat", "inplace"], default="auto",
                   help="fused-collective packing: zero-copy where producers allow (auto), always cat, or prefer in place")
    p.add_argument("--min-gain-us", type=float, default=1.0, help="a fork/join must save this much (default 1 us)")
    p.add_argument("--free-overlap", action="store_true",
                   help="rate overlapped ops as if they did not share HBM bandwidth (the older model)")
    p.add_argument("--device-profile", metavar="JSON", help="device profile overriding the H200 defaults")
    p.add_argument("--tuning", metavar="JSON", help="tuning file from `planner tune` (limits and measured times)")
    p.add_argument("--device-name", metavar="NAME", default=None,
                   help="device whose shipped tuning (planner/tuned/) applies without --tuning"
                        " (default: NVIDIA H200, the default profile's; 'none': the plan's defaults)")


def _emit(p) -> None:
    p.add_argument("--emit", choices=["text", "json"], default="text")


def _add_validate_compile(sub) -> None:
    v = sub.add_parser("validate", help="check a plan; exit 0 if valid, 2 with located errors if not")
    _plan_args(v)
    _emit(v)
    v.set_defaults(handler="planner.commands:cmd_validate")

    c = sub.add_parser("compile", help="plan fusion, streams and events; print the schedule and estimates")
    _plan_args(c)
    _compile_args(c)
    _emit(c)
    c.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE")
    c.add_argument("--full", action="store_true", help="list every op, also in repeated regions")
    c.add_argument("--verify-each", action="store_true", help="run verify() after every pass")
    c.add_argument("--dump-after", action="append", default=[], metavar="PASS",
                   help="print the plan after PASS (to stderr)")
    c.set_defaults(handler="planner.commands:cmd_compile")


def _add_viz(sub) -> None:
    p = sub.add_parser("viz", help="draw the compiled dependency graph (stream lanes, events, variants)",
                       description="Draw a plan's compiled dependency graph: one lane per stream, event"
                       " edges, fused collectives, gated variants side by side, repeated layers collapsed.")
    _plan_args(p)
    p.add_argument("-o", "--output", help="out.svg | out.png | out.html | out.dot (default: DOT on stdout)")
    p.add_argument("--format", choices=FORMATS, help="override the format implied by -o")
    p.add_argument("--variant", metavar="NAME", help="show only this variant of each region that has it")
    p.add_argument("--after", metavar="PASS", help="stop the pipeline after this pass")
    p.add_argument("--disable", action="append", metavar="PASS", help="disable a pass (repeatable)")
    p.add_argument("--expand", action="store_true", help="draw every repeated layer instead of one with a count")
    p.add_argument("--streams", type=int, default=None, metavar="N",
                   help="stream bound, as compile's --streams (default: the plan's streams)")
    p.add_argument("--lanes", choices=["inner", "outer"], default="inner",
                   help="inner: stream lanes inside each region/variant box (default); outer: one column per stream")
    p.add_argument("--timeout", type=_seconds, default=120.0, help="seconds Graphviz may take (default 120)")
    p.set_defaults(handler="planner.viz.commands:cmd_viz")

    t = sub.add_parser("timeline", help="draw measured per-stream timelines (Gantt) from records JSON",
                       description="Per-stream Gantt chart of measured op times: one row per stream, bars"
                       " coloured by op kind, shaded where streams overlap.")
    t.add_argument("records", help='JSON: [{"stream", "op", "kind", "start_us", "end_us"}, ...]')
    t.add_argument("-o", "--output", required=True, help="out.svg | out.png")
    t.add_argument("--title", default="", help="title above the chart")
    t.set_defaults(handler="planner.viz.commands:cmd_timeline")


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="run a plan on N local ranks on random inputs (--check: against the reference)",
                       epilog=RUN_EPILOG)
    _plan_args(p)
    _compile_args(p)
    p.add_argument("--world-size", type=int, default=None, metavar="N",
                   help="number of ranks (default: the smallest number every plan group's size divides, or 1);"
                        " each plan group gets process groups of its own: all ranks, or blocks of its size")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="gloo on cpu, NCCL on cuda")
    p.add_argument("--check", action="store_true", help="compare every output with the unfused reference")
    p.add_argument("--num-tokens", type=int, default=None, metavar="T", help="value of the num_tokens dim")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=V",
                   help="value of any dim (repeatable, e.g. --dim num_seqs=4); the others are drawn from --seed")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument("--same-weights", action="store_true",
                   help="draw every weight the same on every rank (replicated weights); by default each rank"
                        " draws its own, as TP shards are")
    p.add_argument("--timeout", type=_seconds, default=300.0, metavar="SEC", help="give up on the ranks after this")
    _emit(p)
    p.add_argument("--timeline", metavar="FILE", help="also record when each op ran on each stream (rank 0) and draw"
                   " it: .png/.svg picture, or .json records (CUDA events on GPU, wall clock on CPU)")
    p.add_argument("--as-if-capturing", action="store_true",
                   help="for --timeline: evaluate gates as if a CUDA graph were being captured (selects the"
                        " multi-stream variants while running eagerly)")
    p.set_defaults(handler="executors.tools.commands:cmd_run")


def _add_tune_bench(sub) -> None:
    t = sub.add_parser("tune", help="time gemm backends/configs and region variants per bucket on this GPU;"
                                    " write a tuning file (GPU only)")
    _plan_args(t)
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
    t.add_argument("--externs", metavar="MODULE:NAME",
                   help="the model code's implementations (a dict, or a function returning one, of extern name ->"
                        " callable); each extern site is then timed per bucket and its measured time replaces"
                        " cost_us in the cost model")
    t.add_argument("--budget-s", type=float, default=None,
                   help="after this many seconds, remaining shapes time only torch and the default config")
    t.set_defaults(handler="executors.tools.commands:cmd_tune")

    b = sub.add_parser("bench", help="time the compiled plan vs its unfused reference and the floor (GPU only)")
    _plan_args(b)
    b.add_argument("--tokens", metavar="LIST", help="values of the dynamic dim (default: its buckets)")
    b.add_argument("--tuning", metavar="FILE", help="tuning file from `planner tune`")
    b.add_argument("--world-size", type=int, default=None, help="ranks (default: the plan's group size)")
    b.add_argument("--iters", type=int, default=20)
    b.add_argument("--trials", type=int, default=5)
    b.add_argument("--sets", type=int, default=4)
    b.add_argument("--out", metavar="DIR", help="write bench_<plan>.json/.csv/.md here")
    _emit(b)
    b.set_defaults(handler="executors.tools.commands:cmd_bench")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="planner", description="Declarative multi-stream collective/GEMM plans for NVIDIA GPUs.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_validate_compile(sub)
    _add_viz(sub)
    _add_run(sub)
    _add_tune_bench(sub)
    return p


def _handler(ref: str):
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser.parse_args(argv)
    except _Usage as exc:
        return _usage_error(exc, argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        if args.handler.startswith("planner."):  # plan-time commands: short, and they build large object graphs
            with no_gc():
                return int(_handler(args.handler)(args) or 0)
        return int(_handler(args.handler)(args) or 0)
    except PlanError as err:
        print_plan_error(err, getattr(args, "emit", "text"))
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a path given on the command line that cannot be read or written
        given = [Path(os.path.abspath(str(v))) for v in vars(args).values() if isinstance(v, (str, Path)) and v]
        bad = Path(os.path.abspath(str(exc.filename))) if exc.filename is not None else None
        if bad is None or not any(g == bad or bad in g.parents for g in given):  # the path or a folder on it
            raise
        why = exc.strerror or type(exc).__name__
        print_plan_error(PlanError.at(Loc(str(exc.filename)), "io", f"cannot use {exc.filename}: {why}"),
                         getattr(args, "emit", "text"))
        return 2
    except Exception as exc:
        from .verify import VerifyError  # lazily: validate/compile stay light to import
        if not isinstance(exc, VerifyError):
            raise
        from .commands import verify_failure
        print(verify_failure(exc), file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
