"""Handlers of `planner run`, `planner tune` and `planner bench` (parsers: planner.cli).

run: execute a compiled plan on N local ranks on seeded random inputs (executors.tools.check.make_data),
externs bound to the deterministic stand-ins of executors.tools.externs; with --check every output is
compared with the unfused single-stream plan: bit-exact for data movement, allclose where arithmetic is
involved. Exit 0 ok, 1 mismatch or a rank failed, 2 invalid input.
tune / bench: GPU only (exit 2 with a clear message without one); tune writes the tuning file
(planner.tuning), bench prints compiled vs unfused reference vs floor.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback

from planner.commands import config_from_args, plan_warnings
from planner.errors import PlanError
from planner.pipeline import compile_plan

MAX_LOCAL_RANKS = 64  # processes planner run starts on one machine (each imports torch)

__all__ = ["cmd_run", "cmd_tune", "cmd_bench"]


def _compile_config(ns: dict, plan, device: str, rank: int = 0):
    """The compile configuration of `planner compile` for this plan: --tuning, else the shipped
    tuning for this GPU (the default device's without one), its measured times and limits."""
    ns = dict(ns)
    if device == "cuda" and not ns.get("device_name"):
        import torch
        ns["device_name"] = torch.cuda.get_device_name(rank)
    return config_from_args(argparse.Namespace(**ns), plan)


def _check_tuned_backends(path) -> None:
    """--tuning's backend names against the registry (the planner knows only their families), so
    a misspelt sub-backend exits 2 naming the file and key, as other tuning-file errors do."""
    if not path:
        return
    from planner.errors import Loc
    from planner.tuning import read_tuning

    from ..errors import BuildError
    from ..tuning import check_backends
    try:
        check_backends(read_tuning(path), "")
    except BuildError as exc:
        raise PlanError.at(Loc(str(path)), "schema", str(exc)) from None


def _rank_body(rank, world, path, overrides, ns, device, check, dims, seed):
    from planner.lang.loader import load_plan

    from .check import run_check
    from .ranks import run_groups
    plan = load_plan(path, overrides)
    cfg = _compile_config(ns, plan, device, rank)
    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    # the executor's tuning: the --tuning file (its backends and limits); without it build_executor
    # matches this device's shipped tuning itself (none on a CPU)
    tuning = ns["tuning"] if ns.get("tuning") else None
    groups = run_groups(plan.groups, world)
    report = run_check(lambda: load_plan(path, overrides), rank=rank, dims=dims, seed=seed, device=dev,
                       compare=check, config=cfg, tuning=tuning, group=groups,
                       same_weights=bool(ns.get("same_weights")))
    if ns.get("timeline"):
        tl = _timeline(load_plan(path, overrides), cfg, dev, dims, seed, tuning, ns, rank, groups)
        if tl is not None:
            report["timeline"] = tl
    return report


def _dim_args(args) -> dict:
    """--num-tokens T and --dim NAME=V (repeatable) as {dim: value}; a malformed one exits 2."""
    out = {}
    for item in getattr(args, "dim", None) or []:
        name, sep, val = item.partition("=")
        if not sep or not name.strip() or not val.strip().lstrip("-").isdigit():
            raise PlanError.at(None, "param", f"--dim {item!r}: expected NAME=INTEGER, e.g. --dim num_seqs=4")
        out[name.strip()] = int(val)
    if args.num_tokens is not None:
        if "num_tokens" in out and out["num_tokens"] != args.num_tokens:
            raise PlanError.at(None, "param", f"--num-tokens {args.num_tokens} and --dim num_tokens="
                               f"{out['num_tokens']} disagree")
        out["num_tokens"] = args.num_tokens
    return out


def _replay_records(ex, inputs: dict, b: dict, replays: int = 3) -> list[dict]:
    """Capture one call in a CUDA graph (gates see capturing=True, as in production), replay it
    under torch.profiler and return its kernels per stream as timeline records."""
    import json as _json
    import tempfile

    import torch

    from planner.viz.profiler_trace import records
    dev = ex.device
    static = {k: v.clone() for k, v in inputs.items()}
    facts = ex.facts(static, b, capturing=True)
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(3):  # warm the variants the capture takes
            ex(dims=b, _facts=facts, **static)
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ex(dims=b, **static)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize(dev)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize(dev)
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/trace.json"
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = _json.load(f)
    return records(trace)


def _timeline(plan, cfg, dev, dims, seed, tuning, ns, rank: int = 0, groups=None) -> dict | None:
    """One traced call after a warm-up (every rank runs it: collectives need all); rank 0 draws."""
    import json as _json

    from ..lowering import build_executor
    from .check import compile_for_run, make_data, pick_dims
    from .externs import default_externs
    b = pick_dims(plan, None, seed, dims)
    inputs, weights = make_data(plan, b, seed, rank, dev, bool(ns.get("same_weights")))
    cp = compile_for_run(plan, cfg)
    ex = build_executor(cp, weights, group=groups, device=dev, externs=default_externs(plan), tuning=tuning,
                        agree=False)
    cuda = str(dev).startswith("cuda")
    if cuda:
        recs = _replay_records(ex, inputs, b)  # what the GPU did inside graph replays
    else:
        facts = ex.facts(inputs, b, capturing=True if ns.get("as_if_capturing") else None)
        for _ in range(3):
            ex(dims=b, _facts=facts, **inputs)
        with ex.trace():
            ex(dims=b, _facts=facts, **inputs)
        recs = ex.last_trace
    if rank != 0:
        return None
    path = ns["timeline"]
    title = f"{plan.name}: {', '.join(f'{k}={v}' for k, v in b.items())}; variants " + ", ".join(
        sorted(set(ex.last_variants.values())) or ["-"]) + (" (kernels per stream in CUDA-graph replays, torch.profiler)"
                                                           if cuda else " (CPU wall clock: streams run in program order)")
    if path.lower().endswith(".json"):
        with open(path, "w") as f:
            _json.dump(recs, f, indent=1)
    else:
        from planner.viz.timeline import render_timeline
        render_timeline(recs, path, title)
    # the variants the timeline shows: under --as-if-capturing (or a GPU's graph replay) they can
    # differ from the run's table, which evaluates the gates eagerly
    return {"path": path, "ops": len(recs), "streams": sorted({r["stream"] for r in recs}),
            "variants": dict(ex.last_variants), "capturing": cuda or bool(ns.get("as_if_capturing"))}


class _Overdue(BaseException):
    """The single-rank run's alarm: not an Exception, so no handler inside the run takes it."""


def _one_rank(body, timeout_s: float | None = None) -> dict:
    """The single-process run, its failures reported like a rank's (a line, not a traceback), and
    given up after timeout_s as the ranks of a multi-rank run are (an alarm: the main thread)."""
    import signal
    import threading

    from .ranks import RankFailure
    timed = timeout_s is not None and threading.current_thread() is threading.main_thread() \
        and hasattr(signal, "setitimer")
    if timed:
        def overdue(signum, frame):
            raise _Overdue()
        old = signal.signal(signal.SIGALRM, overdue)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return _rank_body(0, 1, *body)
    except PlanError:
        raise
    except _Overdue:
        err = ("Timeout", f"no result within {timeout_s:g}s")
        raise RankFailure({0: err}, {}, (0, *err)) from None
    except Exception as exc:  # the run's own failure, reported as one line with exit 1
        if os.environ.get("PLANNER_DEBUG"):
            traceback.print_exc()
        err = (type(exc).__name__, " ".join(str(exc).split())[:800])
        raise RankFailure({0: err}, {}, (0, *err)) from None
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def _world(plan, given: int | None) -> int:
    """--world-size of run and bench, or the smallest world every plan group's size divides;
    exit 2 for one the groups cannot be laid out on or planner run cannot start here."""
    sizes = sorted({s for s in plan.groups.values() if s > 1})
    need = math.lcm(*sizes, 1)  # every group size divides it: the smallest such world
    world = need if given is None else given
    if world < 1:
        raise PlanError.at(None, "param", "--world-size must be at least 1")
    if world > MAX_LOCAL_RANKS:
        what = "--world-size" if given else "the smallest world the group sizes " + ", ".join(map(str, sizes)) + " divide"
        raise PlanError.at(None, "param", f"{world} ranks ({what}) is more than planner run starts on one machine"
                           f" ({MAX_LOCAL_RANKS})")
    for name, size in plan.groups.items():
        if world % size:
            made = plan.group_params.get(name) or []
            fits = [c for c in plan.param_choices.get(made[0], []) if type(c) is int and c > 0 and world % c == 0] \
                if len(made) == 1 and made[0] in plan.param_choices else None
            how = (f"--set {made[0]}={' or '.join(map(str, fits))} (its choices that divide {world})" if fits else
                   f"no choice of {made[0]} divides {world}" if fits is not None else
                   f"--set {made[0]}={world} or another size that divides {world}" if len(made) == 1 else
                   f"--set {', '.join(made)} (the group's size is made of them)" if made else
                   f"write the group's size as one that divides {world}")
            ranks = f"{need} ranks" if need == size else f"{need} ranks (every group size divides it)"
            if size > world:
                raise PlanError.at(None, "param", f"plan group '{name}' has size {size} but --world-size is {world}"
                                   f" (run with {ranks}, or {how})")
            raise PlanError.at(None, "param", f"plan group '{name}' has size {size}, which does not divide"
                               f" --world-size {world}: each rank must sit in one block of {size} ranks"
                               f" (run with {ranks}, or {how})")
    return world


def _sizes_arg(flag: str, text: str | None, plan, dim: str) -> list:
    """--tokens of bench, --buckets of tune: integers and LO..HI ranges inside the dim's range."""
    from .bench import MAX_SIZES, SizeOutOfRange, TooManySizes, parse_tokens
    d = plan.dims[dim]
    try:
        out = parse_tokens(text, d.buckets, bounds=(d.lo, d.hi))
        if not out:  # "," or a range such as 8..1
            raise ValueError(text)
    except TooManySizes as e:
        raise PlanError.at(None, "param", f"{flag} {text!r} lists {e.count:,} sizes; at most {MAX_SIZES:,}"
                           " (each is a run)") from None
    except SizeOutOfRange as e:
        raise PlanError.at(None, "param", f"{flag}: {e.value} is outside {dim}'s range {d.lo}..{d.hi}") from None
    except ValueError:
        raise PlanError.at(None, "param", f"{flag} {text!r}: expected sizes of {dim} such as 1,2,4..8") from None
    return out


def cmd_run(args) -> int:
    from planner.lang.loader import load_plan, parse_overrides

    from .check import pick_dims
    from .ranks import RankFailure, run_ranks
    overrides = parse_overrides(args.overrides)
    plan = load_plan(args.plan, overrides)
    world = _world(plan, args.world_size)
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise PlanError.at(None, "param", f"--device cuda: CUDA is not available here (torch {torch.__version__});"
                               " run with --device cpu (gloo ranks)")
        if torch.cuda.device_count() < world:
            raise PlanError.at(None, "param", f"--device cuda: {world} ranks need {world} GPUs, this host has"
                               f" {torch.cuda.device_count()}")
    dims = _dim_args(args)
    if getattr(args, "as_if_capturing", False) and not getattr(args, "timeline", None):
        raise PlanError.at(None, "param", "--as-if-capturing selects the variants of the --timeline call and"
                           " nothing else (--check runs every variant anyway)", "add --timeline FILE")
    if getattr(args, "timeline", None):  # can it be written: before the run, not after it
        from planner.viz.commands import check_timeline_output
        check_timeline_output(args.timeline, "--timeline", also=(".json",))
        existed = os.path.exists(args.timeline)
        try:
            open(args.timeline, "ab").close()
            if not existed:
                os.remove(args.timeline)
        except OSError as exc:
            raise PlanError.at(None, "io", f"cannot write the timeline to {args.timeline}:"
                               f" {exc.strerror or type(exc).__name__}") from None
    bindings = pick_dims(plan, None, args.seed, dims)  # range errors exit 2 here, not inside a rank
    ns = {k: v for k, v in vars(args).items() if k != "handler"}
    # tuning-file errors (unknown key, a limit the plan does not declare) exit 2 here, naming the file
    cfg = config_from_args(argparse.Namespace(**ns), plan)
    _check_tuned_backends(getattr(args, "tuning", None))
    cp = compile_plan(load_plan(args.plan, overrides), cfg)  # compile errors exit 2 before spawning
    plan_warnings(cp, cfg)
    from ..resources import check_run
    check_run(cp, bindings, args.device, world, args.check)  # a 52 TB input exits 2 here, not in an allocator
    body = (args.plan, overrides, ns, args.device, args.check, dims, args.seed)
    try:
        if world == 1 and all(s == 1 for s in plan.groups.values()):
            reports = [_one_rank(body, args.timeout)]
        else:
            reports = run_ranks(_rank_body, world, *body, backend="nccl" if args.device == "cuda" else "gloo",
                                timeout_s=args.timeout)
    except RankFailure as exc:
        first = exc.first
        if args.emit == "json":
            print(json.dumps({"ok": False, "first": None if first is None else
                              {"rank": first[0], "type": first[1], "message": first[2]},
                              "errors": {str(r): {"type": t, "message": m}
                                         for r, (t, m) in exc.errors.items()}}, indent=2))
        else:
            if first is not None:
                print(f"rank {first[0]} failed first: {first[1]}: {first[2]}")
            for r, (t, m) in sorted(exc.errors.items()):
                if first is None or r != first[0]:
                    print(f"rank {r}: {t}: {m}")
            print("result: FAILED")
        return 1
    ok = all(r["ok"] for r in reports) if args.check else True
    if args.emit == "json":
        print(json.dumps({"ok": ok, "world_size": world, "device": args.device, "checked": args.check, "same_weights": args.same_weights,
                          "ranks": reports}, indent=2, default=str))
    else:
        print(_table(reports, world, args))
        tl = reports[0].get("timeline")
        if tl:
            print(f"timeline: {tl['ops']} ops on {', '.join(tl['streams'])}{_timeline_variants(tl, reports[0])}"
                  f" -> {tl['path']}")
    return 0 if ok else 1


def _timeline_variants(tl: dict, r0: dict) -> str:
    """The timeline's variants, named where they differ from the table's (gates as if capturing)."""
    if tl["variants"] == r0["variants"]:
        return ""
    how = "gates as if capturing" if tl["capturing"] else "gates evaluated again"
    return " (" + how + ": " + ", ".join(f"{r} {v}" for r, v in sorted(tl["variants"].items())) + ")"


def _table(reports: list[dict], world: int, args) -> str:
    r0 = reports[0]
    dims = ", ".join(f"{k}={v}" for k, v in r0["dims"].items())
    lines = [f"plan {r0['plan']}: {world} rank(s) on {args.device}, {dims}, seed {args.seed}"
             + (", the same weights on every rank" if getattr(args, "same_weights", False) else ""),
             f"passes: {', '.join(r0['passes']) or '(none)'}; backends: {', '.join(r0['backends'])}"]
    if r0["variants"]:
        lines.append("variants:")
        for region, v in sorted(r0["variants"].items()):
            ref = r0.get("ref_variants", {}).get(region)
            same = all(r["variants"].get(region) == v for r in reports)
            lines.append(f"  {region:<24} {v}" + (f"   (reference: {ref})" if ref is not None else "")
                         + ("" if same else "   (ranks differ!)"))
    rows = [("output", "shape", "dtype", "max_abs_err", "check", "ok")]
    for i, o in enumerate(r0["outputs"]):
        per = [r["outputs"][i] for r in reports]
        if args.check:
            err = max(p["max_abs_err"] for p in per)
            okv = all(p["ok"] for p in per)
            rows.append((o["name"], str(o["shape"]), o["dtype"], f"{err:.3g}",
                         "exact" if o["exact"] else "allclose", "yes" if okv else "NO"))
        else:
            rows.append((o["name"], str(o["shape"]), o["dtype"], "-", "-", "-"))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        lines.append("  ".join(x.ljust(w) for x, w in zip(r, widths, strict=False)).rstrip())
    if args.check and r0.get("checked"):
        lines.append("variants checked against the reference (each forced in turn, run eagerly):")
        for i, c in enumerate(r0["checked"]):
            good = all(r["checked"][i]["ok"] for r in reports)
            what = "as the gates chose" if c["forced"] is None else "forced " + ", ".join(
                f"{k}={v}" for k, v in sorted(c["forced"].items())[:3]) + (
                f" (+{len(c['forced']) - 3} regions)" if len(c["forced"]) > 3 else "")
            if c.get("stream_plan"):
                what = (f"{what}, stream plan of {c['stream_plan']}" if i == 0 else
                        f"stream plan of {c['stream_plan']} (forced)")
            unreached = c.get("unreached") or []
            if unreached and len(unreached) == len(c["forced"] or {}):
                what += " (never reached at these dims: the variants around it did not run)"
            elif unreached:
                what += f" ({len(unreached)} of its regions not reached at these dims)"
            if good:
                lines.append(f"  {what}: ok")
                continue
            bad = {n: [r["rank"] for r in reports if n in r["checked"][i]["bad"]]
                   for r in reports for n in r["checked"][i]["bad"]}
            lines.append(f"  {what}: MISMATCH in " + ", ".join(
                n + ("" if len(rk) == len(reports) else f" (rank {', '.join(map(str, rk))})") for n, rk in bad.items()))
    if args.check:
        ok = all(r["ok"] for r in reports)
        why = sorted({r.get("why") for r in reports if r.get("why")})
        lines.append(f"result: {'OK' if ok else 'MISMATCH'} ({len(r0['outputs'])} outputs x {world} rank(s))"
                     + (f": {'; '.join(why)}" if why else ""))
    return "\n".join(lines)


def _need_gpu() -> None:
    """tune and bench time kernels: without a CUDA GPU, an error with exit 2 (JSON under --emit json)."""
    try:
        import torch
    except ImportError:
        raise PlanError.at(None, "param", "this command needs torch and a CUDA GPU") from None
    if not torch.cuda.is_available():
        raise PlanError.at(None, "param", "this command times kernels and needs a CUDA GPU (none found)")


def cmd_tune(args) -> int:
    from planner.lang.loader import parse_overrides

    from .tune import save_tuning, tune_plan
    overrides = parse_overrides(args.overrides)
    from planner.lang.loader import load_plan
    plan = load_plan(args.plan, overrides)  # plan and argument errors exit 2 before anything else
    if args.dim not in plan.dims:
        raise PlanError.at(None, "param", f"--dim {args.dim}: plan '{plan.name}' has no dim '{args.dim}'"
                           f" (dims: {', '.join(plan.dims) or 'none'})")
    buckets = _sizes_arg("--buckets", args.buckets, plan, args.dim) if args.buckets else None
    externs = None
    if args.externs:
        from .tune_externs import load_externs
        try:
            externs = load_externs(args.externs)
        except ValueError as exc:
            print(f"planner tune: {exc}", file=sys.stderr)
            return 2
    _need_gpu()
    res = tune_plan(args.plan, overrides, dim=args.dim, buckets=buckets, externs=externs,
                    externs_from=args.externs,
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


def cmd_bench(args) -> int:
    from planner.commands import read_plan_tuning
    from planner.lang.loader import load_plan, parse_overrides

    from .bench import BENCH_COLS, bench_plan, write_report
    overrides = parse_overrides(args.overrides)
    plan = load_plan(args.plan, overrides)  # plan and argument errors exit 2 before anything else
    dim = "num_tokens" if "num_tokens" in plan.dims else next(iter(plan.dims), None)
    tokens = _sizes_arg("--tokens", args.tokens, plan, dim) if dim else []
    world = _world(plan, args.world_size)  # as planner run
    if args.tuning:
        read_plan_tuning(args.tuning, plan)
        _check_tuned_backends(args.tuning)
    _need_gpu()
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
