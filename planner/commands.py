"""Handlers of `planner validate` and `planner compile` (parsers: planner.cli)."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from .config import MAX_STREAMS, CompileConfig
from .cost import DeviceProfile
from .errors import Loc, PlanError
from .lang.loader import load_plan, parse_overrides
from .tuning import (
    DEFAULT_DEVICE,
    check_limits,
    check_variants,
    extern_note,
    gemm_shapes,
    match_tuning,
    read_tuning,
)

__all__ = ["cmd_validate", "cmd_compile", "config_from_args", "tuned_config", "verify_failure"]



def verify_failure(exc) -> str:
    """The one message of a plan the planner compiled but cannot prove right (exit 1)."""
    return f"planner: internal error: the compiled plan fails verification: {exc}"


def read_plan_tuning(path, plan) -> dict:
    """A --tuning file for this plan, strictly: its limits must be the plan's and its variant
    records of the plan's regions; a located PlanError (exit 2) naming the file otherwise."""
    tuning = read_tuning(path)
    try:  # the error's location names the file
        check_limits(tuning, plan.tuned, "", plan.name)
        check_variants(tuning, plan.regions, "", plan.name)
    except ValueError as exc:
        raise PlanError.at(Loc(str(path)), "schema", str(exc)) from None
    return tuning


def resolve_compile_tuning(args, plan) -> tuple[dict, str]:
    """(tuning, source line) for compile/viz: --tuning FILE (strict, its limits must be the
    plan's), else the shipped tuning for --device-name (default the H200 of the default profile;
    versions are not checked: compile runs no kernel), else none with a note."""
    path = getattr(args, "tuning", None)
    if path:
        return read_plan_tuning(path, plan), str(path)
    device = getattr(args, "device_name", None) or DEFAULT_DEVICE
    if device == "none":
        return {}, "none (--device-name none): plan defaults"
    data, source = match_tuning(device, plan.tuned, gemm_shapes(plan))
    return (data or {}), source


def tuned_config(plan, tuning: dict | None = None, device: str = DEFAULT_DEVICE, source: str | None = None,
                 **kw) -> CompileConfig:
    """The CompileConfig `planner compile` uses for a plan: the cost model reads the tuning's
    measured times and the gates its limits; tuning None: the shipped tuning matching `device`
    and the plan (planner/tuned/), if any. source: where a given tuning came from (the report's
    tuning line). kw: other CompileConfig fields (num_streams, profile, ...)."""
    source = "tuning= (given)" if source is None else source
    if tuning is None:
        data, source = match_tuning(device, plan.tuned, gemm_shapes(plan))
        tuning = data or {}
    import dataclasses
    profile = dataclasses.replace(kw.pop("profile", None) or DeviceProfile())  # the caller's stays as it is
    if tuning.get("measured"):
        profile.measured = {k: v for k, v in tuning["measured"].items() if isinstance(v, (int, float))}
    return CompileConfig(profile=profile, tuned={k: int(v) for k, v in tuning.get("limits", {}).items()},
                         tuning_source=source + extern_note(tuning), **kw)


def check_stream_bound(n: int | None) -> None:
    """--streams N of compile, run and viz: None (the plan's streams) or 1..MAX_STREAMS."""
    if n is not None and not 1 <= n <= MAX_STREAMS:  # each stream pairs with every other in the hazard walk
        raise PlanError.at(None, "param", f"--streams must be 1..{MAX_STREAMS}, got {n}")


def config_from_args(args, plan=None) -> CompileConfig:
    if plan is not None:
        tuning, source = resolve_compile_tuning(args, plan)
    else:
        tuning, source = read_tuning(getattr(args, "tuning", None)), getattr(args, "tuning", None) or "none"
    profile = DeviceProfile.load(getattr(args, "device_profile", None))
    check_stream_bound(args.streams)
    if not 0 < args.bucket_cap_mb < float("inf"):  # NaN fails too; 0 would make every bucket too big
        raise PlanError.at(None, "param", f"--bucket-cap-mb must be a finite number > 0, got {args.bucket_cap_mb}",
                           "to turn collective fusion off, use --disable-pass fuse-collectives")
    if not (args.min_gain_us >= 0 and args.min_gain_us != float("inf")):  # NaN fails the first test
        raise PlanError.at(None, "param", f"--min-gain-us must be a finite number >= 0, got {args.min_gain_us}")
    return tuned_config(
        plan, tuning, source=source or "", profile=profile,
        disable_passes=set(args.disable_pass), num_streams=args.streams, bucket_cap_mb=args.bucket_cap_mb,
        packing=args.packing, min_gain_us=args.min_gain_us,
        share_bandwidth=not getattr(args, "free_overlap", False),
        verify_each=getattr(args, "verify_each", False),
        dump_after=set(getattr(args, "dump_after", []) or []),
    )


def cmd_validate(args) -> int:
    from .pipeline import compile_plan
    from .verify import VerifyError
    t0 = time.perf_counter()
    plan = load_plan(args.plan, parse_overrides(args.overrides))
    counts = {"ops": len(plan.ops), "regions": len(plan.regions), "inputs": len(plan.inputs),
              "weights": len(plan.weights)}  # as written (planning rewrites ops)
    # the checks that need a planned plan (cross-stream hazards, capture legality of capture-gated
    # variants, collective order) run too: a plan validate accepts, compile accepts
    cfg = tuned_config(plan)
    try:
        cp = compile_plan(plan, cfg)
    except VerifyError as exc:
        print(verify_failure(exc), file=sys.stderr)
        return 1
    dt = time.perf_counter() - t0
    warnings = plan_warnings(cp, cfg, dead_variants=True)
    if args.emit == "json":
        print(json.dumps({"ok": True, "plan": plan.name, "ops": counts["ops"], "regions": counts["regions"],
                          "planned": True, "warnings": warnings}))
    else:
        print(f"{plan.file}: ok: plan '{plan.name}', {counts['ops']} ops, {counts['regions']} gated regions,"
              f" {counts['inputs']} inputs, {counts['weights']} weights; planned and verified ({dt * 1000:.0f} ms)")
    return 0


def plan_warnings(cp, cfg, stream=None, dead_variants: bool = False) -> list[str]:
    """What a compiled plan runs differently from what it says, one line each, also written to
    `stream` as "warning: ...": pins folded onto main by a --streams bound, model code dce
    removed, and (dead_variants: validate, whose output has no report) variants that never run."""
    out = [f"{f['loc']}: {f['text']}" if f["loc"] else f["text"]
           for f in cp.report.get("assign-streams:folded", [])]
    out += [(f"{e['loc']}: " if e["loc"] else "") + f"extern '{e['id']}' ({e['fn']}) is removed: nothing reads its"
            " results (write effects=true to run model code for what it does beyond them)"
            for e in cp.report.get("dce:externs", [])]
    out += _dead_variants(cp, cfg) if dead_variants else []
    for w in out:
        print(f"warning: {w}", file=stream or sys.stderr)
    return out


def _dead_variants(cp, cfg) -> list[str]:
    """One line per variant (of each group of alike regions) that takes no call at any size."""
    from .analysis import group_label, never_running, region_groups
    tuned = {**cp.plan.tuned, **cfg.tuned}
    never = never_running(cp, tuned)
    out = []
    for rids in region_groups(cp):
        for v in cp.variants.get(rids[0], []):
            why = never.get((rids[0], v.name))
            if why:
                loc = v.loc
                where = f"{loc}: " if loc is not None and loc.line else ""
                lim = sorted({n[6:] for n in re.findall(r"tuned\.\w+", v.when_src or "")})
                limits = (f" (tuned limits {', '.join(f'{n}={tuned.get(n)}' for n in lim)} from"
                          f" {cfg.tuning_source or 'the plan'})") if lim else ""
                out.append(f"{where}variant '{v.name}' of region {group_label(rids)} never runs{limits}: {why}")
    return out


def cmd_compile(args) -> int:
    from .pipeline import compile_plan
    from .report import dumps_json, to_text
    from .verify import VerifyError
    if args.output and Path(args.output).resolve() == Path(args.plan).resolve():
        raise PlanError.at(None, "param", f"-o {args.output} is the plan file itself: the report would overwrite it",
                           "write the report to another file")
    plan = load_plan(args.plan, parse_overrides(args.overrides))
    cfg = config_from_args(args, plan)
    try:
        cp = compile_plan(plan, cfg)  # verifies the result (and after every pass with --verify-each)
    except VerifyError as exc:
        print(verify_failure(exc), file=sys.stderr)
        return 1
    for name, text in cfg.dumps:
        print(f"===== after {name} =====", file=sys.stderr)
        print(text, file=sys.stderr)
    plan_warnings(cp, cfg)
    text = dumps_json(cp, cfg) + "\n" if args.emit == "json" else to_text(
        cp, cfg, color=None if not args.output else False, full=args.full)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)  # as viz -o and tune -o do
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
