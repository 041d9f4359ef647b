"""`planner validate` and `planner compile`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .config import CompileConfig
from .cost import DeviceProfile
from .errors import PlanError
from .loader import load_plan, parse_overrides
from .passes import PASS_NAMES

__all__ = ["register", "config_from_args", "add_plan_args"]


def add_plan_args(p) -> None:
    p.add_argument("plan", help="plan file (YAML)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                   help="override a param, e.g. --set tp_size=4 (repeatable)")


def add_compile_args(p) -> None:
    p.add_argument("--disable-pass", action="append", default=[], metavar="NAME",
                   help=f"skip a pass ({', '.join(PASS_NAMES)})")
    p.add_argument("--streams", type=int, default=2, help="stream pool size: main + N-1 shared aux (default 2)")
    p.add_argument("--bucket-cap-mb", type=float, default=512.0, help="byte cap of one fused collective (default 512)")
    p.add_argument("--packing", choices=["auto", "cat", "inplace"], default="auto",
                   help="fused-collective packing: zero-copy where producers allow (auto), always cat, or prefer in place")
    p.add_argument("--min-gain-us", type=float, default=1.0, help="a fork/join must save this much (default 1 us)")
    p.add_argument("--device-profile", metavar="JSON", help="device profile overriding the H200 defaults")
    p.add_argument("--tuning", metavar="JSON", help="tuning file from `planner tune` (limits and measured times)")


def load_tuning(path: str | None) -> dict:
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError.at(None, "io", f"cannot read tuning file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise PlanError.at(None, "schema", f"tuning file {path} must be a JSON object")
    return data


def config_from_args(args) -> CompileConfig:
    tuning = load_tuning(getattr(args, "tuning", None))
    profile = DeviceProfile.load(getattr(args, "device_profile", None))
    if tuning.get("measured"):
        profile.measured = {k: v for k, v in tuning["measured"].items() if isinstance(v, (int, float))}
    if args.streams < 1:
        raise PlanError.at(None, "schema", "--streams must be at least 1")
    return CompileConfig(
        disable_passes=set(args.disable_pass), num_streams=args.streams, bucket_cap_mb=args.bucket_cap_mb,
        packing=args.packing, min_gain_us=args.min_gain_us, profile=profile,
        tuned={k: int(v) for k, v in tuning.get("limits", {}).items()},
        verify_each=getattr(args, "verify_each", False),
        dump_after=set(getattr(args, "dump_after", []) or []),
    )


def _validate(args) -> int:
    t0 = time.perf_counter()
    plan = load_plan(args.plan, parse_overrides(args.overrides))
    dt = time.perf_counter() - t0
    if args.emit == "json":
        print(json.dumps({"ok": True, "plan": plan.name, "ops": len(plan.ops), "regions": len(plan.regions)}))
    else:
        print(f"{plan.file}: ok: plan '{plan.name}', {len(plan.ops)} ops, {len(plan.regions)} gated regions,"
              f" {len(plan.inputs)} inputs, {len(plan.weights)} weights ({dt * 1000:.0f} ms)")
    return 0


def _compile(args) -> int:
    from .graph import VerifyError, verify
    from .pipeline import compile_plan
    from .report import dumps_json, to_text
    cfg = config_from_args(args)
    plan = load_plan(args.plan, parse_overrides(args.overrides))
    try:
        cp = compile_plan(plan, cfg)
        if args.verify_each:
            verify(cp)
    except VerifyError as exc:
        print(f"planner: internal error: the compiled plan fails verification: {exc}", file=sys.stderr)
        return 1
    for name, text in cfg.dumps:
        print(f"===== after {name} =====", file=sys.stderr)
        print(text, file=sys.stderr)
    text = dumps_json(cp, cfg) + "\n" if args.emit == "json" else to_text(
        cp, cfg, color=None if not args.output else False, full=args.full)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def register(sub) -> None:
    v = sub.add_parser("validate", help="check a plan; exit 0 if valid, 2 with located errors if not")
    add_plan_args(v)
    v.add_argument("--emit", choices=["text", "json"], default="text")
    v.set_defaults(handler=_validate)

    c = sub.add_parser("compile", help="plan fusion, streams and events; print the schedule and estimates")
    add_plan_args(c)
    add_compile_args(c)
    c.add_argument("--emit", choices=["text", "json"], default="text")
    c.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE")
    c.add_argument("--full", action="store_true", help="list every op, also in repeated regions")
    c.add_argument("--verify-each", action="store_true", help="run verify() after every pass")
    c.add_argument("--dump-after", action="append", default=[], metavar="PASS",
                   help="print the plan after PASS (to stderr)")
    c.set_defaults(handler=_compile)
