"""What `planner compile` prints: a readable report, or the JSON contract.

JSON contract (docs/cli.md): {"plan", "file", "params", "dims", "groups", "streams",
"ops": [{"id", "op", "stream", "inputs", "outputs", "shapes", "waits_on", "records",
"fused_from", "when", "region", "variant", "cost_us", "cost_at", "attrs"}], "variants": [...],
"events", "exit_waits", "fusion", "stream_decisions", "stream_scopes", "bucket_plans",
"critical_path", "memory",
"passes"}. Keys are emitted in a fixed order; same plan, same bytes.
"""

from __future__ import annotations

import json
import os
import re
import sys

from .analysis import (
    allowed_buckets,
    between_buckets,
    eager_only,
    group_label,
    never_running,
    per_op,
    possible_buckets,
    region_groups,
    simulator,
    size_ranges,
    variant_picks,
    why_never,
)
from .cost import CostModel
from .graph import Compiled, compatible
from .passes.fuse_allreduce_norm import describe as describe_allreduce_norm
from .passes.fuse_gemm_chains import describe as describe_gemm_chains
from .shapes import fmt_dim, fmt_shape

__all__ = ["to_json", "to_text", "critical_paths"]


def _gate_of(cp: Compiled, ctx: tuple) -> str | None:
    if not ctx:
        return None
    parts = []
    for rid, vname in ctx:
        vs = cp.variants.get(rid) or cp.plan.regions[rid].variants
        v = next((x for x in vs if x.name == vname), None)
        if v is None or v.when is None:  # the fallback: none of the gates before it
            earlier = [x.when_text for x in vs if x.name != vname and x.when is not None]
            if earlier:
                parts.append(f"not ({' or '.join(earlier)})" if len(earlier) > 1 or " " in earlier[0]
                             else f"not {earlier[0]}")
        else:
            parts.append(f"({v.when_text})" if " or " in v.when_text and len(ctx) > 1 else v.when_text)
    return " and ".join(parts) or "always"


def _estimates(cp: Compiled, cfg) -> tuple[list[dict], list[str]]:
    """(critical_paths' rows, the variants whose gates hold at no bucket: named when all regions
    are alike, one variant name at a time; combinations of differing regions that never run
    together are just left out)."""
    model = CostModel(cfg.profile, cp.plan.groups)
    tuned = {**cp.plan.tuned, **cfg.tuned}
    g = cp.graph
    us, nbytes = per_op(cp, model.op_us), per_op(cp, model.op_demand)  # the variants share buckets
    alike = len(region_groups(cp)) == 1
    out, never = [], []
    for label, choice, together in variant_picks(cp):
        ctx = tuple(sorted(choice.items()))
        allowed = possible_buckets(cp, ctx, tuned, together) if choice else allowed_buckets(cp, (), tuned)
        if not allowed:
            if alike:
                rid, vname = next(iter(choice.items()))
                why = why_never(cp, rid, vname, tuned)
                sizes = None if why else between_buckets(cp, ctx, tuned)
                never.append((label, f"runs only in eager calls, at {cp.plan.token_dim} = {size_ranges(sizes)} between"
                                     " the buckets (the estimate is per bucket)" if sizes else
                              f"never runs: {why or 'it takes no call at any bucket'} (with these tuned limits)"))
            continue
        picks = []
        for b in (allowed[0], allowed[len(allowed) // 2], allowed[-1]):
            if b not in picks:
                picks.append(b)
        order = cp.schedule
        if choice:
            ctx_of = {v: g.nodes[v]["ctx"] for v in order}
            fits = {c: compatible(ctx, c) for c in set(ctx_of.values())}  # repeated layers share a few
            order = [v for v in order if fits[ctx_of[v]]]
        sim = simulator(cp, order, cfg.profile.event_us, bytes_per_us=cfg.profile.hbm_gbps * 1e3)
        for b in picks:
            costs = us(order, b)
            demand = nbytes(order, b) if cfg.share_bandwidth else None
            span, finish = sim(costs, demand)
            serial = sum(costs[v] for v in finish)
            out.append({"variant": label, "bindings": b, "scheduled_us": round(span, 2),
                        "serial_us": round(serial, 2)})
    return out, never


def critical_paths(cp: Compiled, cfg) -> list[dict]:
    """Estimated time per variant (combination) at small, typical and large sizes it can see;
    combinations that never run together are left out."""
    return _estimates(cp, cfg)[0]


def op_cost_table(cp: Compiled, cfg) -> dict[str, tuple[float, dict]]:
    """op -> (estimated us, bindings): each op costed at its scope's representative bucket."""
    model = CostModel(cfg.profile, cp.plan.groups)
    tuned = {**cp.plan.tuned, **cfg.tuned}
    at: dict[tuple, dict] = {}
    out = {}
    for v, d in cp.graph.nodes(data=True):
        ctx = d["ctx"]
        if ctx not in at:
            allowed = allowed_buckets(cp, ctx, tuned)
            at[ctx] = allowed[len(allowed) // 2]
        out[v] = (round(model.op_us(d["op"], cp.tensors, at[ctx]), 3), at[ctx])
    return out


def to_json(cp: Compiled, cfg) -> dict:
    plan = cp.plan
    g = cp.graph
    ops = []
    costs = op_cost_table(cp, cfg)
    for v in cp.schedule:
        d = g.nodes[v]
        op = d["op"]
        ctx = d["ctx"]
        attrs = {k: (val if not isinstance(val, (set, tuple)) else list(val)) for k, val in op.attrs().items()
                 if k not in ("x", "a", "b", "xs", "args", "choices", "fused_from")}
        ops.append({
            "id": v, "op": op.op, "stream": d["stream"],
            "inputs": op.inputs(), "outputs": list(op.out),
            "shapes": {n: fmt_shape(cp.tensors[n].shape) + " " + cp.tensors[n].dtype for n in op.out if n in cp.tensors},
            "waits_on": list(d["waits"]), "records": list(d["records"]),
            "fused_from": list(getattr(op, "fused_from", []) or []),
            "when": _gate_of(cp, ctx),
            "region": ctx[-1][0] if ctx else None, "variant": ctx[-1][1] if ctx else None,
            "cost_us": costs[v][0], "cost_at": costs[v][1],
            "out_slot": _slot(d.get("out_slot")),
            "attrs": attrs,
        })
    variants = []
    tuned = {**plan.tuned, **cfg.tuned}
    never, eager = (never_running(cp, tuned), eager_only(cp, tuned)) if cp.variants else ({}, {})
    for rid, reg in plan.regions.items():  # a region removed with the variant it sits in: none live
        vs = cp.variants.get(rid, [])
        for v in reg.variants:
            variants.append({
                "region": rid, "name": v.name, "when": v.when_text, "fallback": v.when is None,
                "live": v in vs, "static": v.static,
                # judged for the first region of each group of alike regions (region_groups)
                "never_runs": never.get((rid, v.name)), "eager_only_sizes": eager.get((rid, v.name)),
                "ops": sum(1 for n in g.nodes if (rid, v.name) in g.nodes[n]["ctx"]),
            })
    return {
        "plan": plan.name, "file": plan.file,
        "params": {k: plan.params[k] for k in sorted(plan.params)},
        "dims": {k: {"min": d.lo, "max": d.hi, "buckets": d.buckets} for k, d in plan.dims.items()},
        "groups": dict(plan.groups),
        "streams": list(cp.streams),
        "inputs": {n: _tensor(cp, n) for n in plan.inputs},
        "weights": {n: _tensor(cp, n) for n in plan.weights},
        "outputs": {n: _tensor(cp, n) for n in plan.outputs},
        "ops": ops,
        "variants": variants,
        "events": {k: cp.events[k] for k in sorted(cp.events)},
        "exit_waits": list(cp.exit_waits),
        "fusion": cp.report.get("fuse-collectives"),
        "allreduce_norm_fusion": cp.report.get("fuse-allreduce-norm"),
        "gemm_chain_fusion": cp.report.get("fuse-gemm-chains"),
        "dce": cp.report.get("dce"),
        "stream_decisions": cp.report.get("assign-streams"),
        "stream_scopes": cp.report.get("assign-streams:scopes"),  # per scope and bucket
        "stream_folds": cp.report.get("assign-streams:folded", []),  # pins a --streams bound put on main
        "bucket_plans": bucket_plans_json(cp),  # per-range stream plans; [] when one assignment serves all
        "externs_without_cost": _uncosted(cp),
        "critical_path": critical_paths(cp, cfg) if cp.schedule else [],
        "memory": cp.report.get("estimate-memory"),
        "profile": cfg.profile.to_json(),
        "passes": list(cp.passes_run),
        "disabled_passes": sorted(cfg.disable_passes),
        "tuning": {"source": getattr(cfg, "tuning_source", ""), "limits": {**cp.plan.tuned, **cfg.tuned}},
    }


def _bucket_plan_lines(cp: Compiled, st) -> list[str]:
    """The per-range stream plans (passes/bucket_plans.py), one line per range."""
    if not cp.bucket_plans:
        return []
    L = [f"  planned per bucket: {len(cp.bucket_plans)} ranges of {cp.bucket_plans[0]['dim']}, each call runs the"
         f" plan of its range"]
    for p, decided in zip(cp.bucket_plans, cp.report.get("plan-buckets") or [], strict=True):
        rng = f"{p['dim']} {p['lo']}..{p['hi']}"
        if p.get("cp") is None:
            L.append(f"    {rng}: the assignment above")
            continue
        side = decided["on_side"]
        on = ", ".join(side) + " on " + ", ".join(sorted({p["streams"][v] for v in side})) if side else "all on main"
        i = max(range(len(p["buckets"])), key=lambda j: p["single_us"][j] - p["scheduled_us"][j])
        ev = p["cp"].report.get("derive-events") or {}
        L.append(f"    {rng}: {st.green(on)}: scheduled {p['scheduled_us'][i]:.1f} us vs {p['single_us'][i]:.1f} us"
                 f" with the assignment above at {p['dim']}={p['buckets'][i]}; {ev.get('events', 0)} record sites,"
                 f" {ev.get('waits', 0)} waits")
    return L


def bucket_plans_json(cp: Compiled) -> list[dict]:
    out = []
    for p in cp.bucket_plans:
        own = p.get("cp")
        out.append({"dim": p["dim"], "min": p["lo"], "max": p["hi"], "buckets": p["buckets"],
                    "scheduled_us": p["scheduled_us"], "single_choice_us": p["single_us"],
                    "streams": None if own is None else {v: p["streams"][v] for v in sorted(p["streams"])},
                    "events": None if own is None else {k: own.events[k] for k in sorted(own.events)},
                    "waits": None if own is None else {v: list(own.graph.nodes[v]["waits"]) for v in own.schedule
                                                       if own.graph.nodes[v]["waits"]},
                    "exit_waits": None if own is None else list(own.exit_waits)})
    return out


def _uncosted(cp: Compiled) -> list[str]:
    """Externs that declare no cost_us: the cost model rates them at 0 us, so the stream planner
    sees no work to overlap with them."""
    return [v for v, d in cp.graph.nodes(data=True) if d["op"].op == "extern" and d["op"].cost_us is None]


def _tensor(cp, n):
    t = cp.tensors.get(n)
    return None if t is None else fmt_shape(t.shape) + " " + t.dtype


def _slot(s):
    if not s:
        return None
    packed, dim, off, size = s
    return {"tensor": packed, "dim": dim, "offset": fmt_dim(off), "size": fmt_dim(size)}


def dumps_json(cp, cfg) -> str:
    return json.dumps(to_json(cp, cfg), indent=2, default=str)


# ---------------------------------------------------------------- text

class _Style:
    def __init__(self, enabled: bool):
        self.on = enabled

    def __call__(self, text, code):
        return f"\033[{code}m{text}\033[0m" if self.on else text

    def bold(self, t):
        return self(t, "1")

    def dim(self, t):
        return self(t, "2")

    def green(self, t):
        return self(t, "32")

    def yellow(self, t):
        return self(t, "33")

    def cyan(self, t):
        return self(t, "36")


def _mib(b: int) -> str:
    return f"{b / 2**20:.1f} MiB"


def _norm(name: str) -> str:
    return re.sub(r"\d+", "#", name)


def _group_labels(labels: list[str]) -> str:
    if len(labels) <= 3:
        return ", ".join(labels)
    return f"{labels[0]}, {labels[1]}, ... ({len(labels)} scopes alike)"


def to_text(cp: Compiled, cfg, color: bool | None = None, full: bool = False) -> str:
    if color is None:
        color = sys.stdout.isatty() and os.environ.get("NO_COLOR") is None
    st = _Style(color)
    plan = cp.plan
    L: list[str] = []
    params = ", ".join(f"{k}={v}" for k, v in plan.params.items() if not isinstance(v, list))
    L.append(st.bold(f"plan {plan.name}") + st.dim(f"  ({plan.file})"))
    L.append(f"  params: {params}")
    dims = ", ".join(f"{k} {d.lo}..{d.hi} (buckets {d.buckets})" for k, d in plan.dims.items())
    if dims:
        L.append(f"  dims: {dims}")
    L.append(f"  {len(plan.ops)} ops written -> {cp.graph.number_of_nodes()} after planning;"
             f" passes: {' > '.join(cp.passes_run)}")
    if getattr(cfg, "tuning_source", ""):
        limits = ", ".join(f"{k}={v}" for k, v in {**plan.tuned, **cfg.tuned}.items())
        L.append(f"  tuning: {cfg.tuning_source}" + (f"; limits {limits}" if limits else ""))
    dce = cp.report.get("dce")
    if isinstance(dce, list) and dce:
        L.append("")
        L.append(st.bold("Dead code"))
        L += [f"  {n}" for n in dce]

    fus = cp.report.get("fuse-collectives")
    L.append("")
    if fus == "disabled":
        L.append(st.bold("Collective fusion") + ": disabled")
    elif isinstance(fus, dict) and not fus["before"]:
        L.append(st.bold("Collective fusion") + ": no all_gather, reduce_scatter, all_reduce or all_to_all left to pack")
    elif isinstance(fus, dict):
        L.append(st.bold("Collective fusion") + f": {fus['before']} collectives -> {fus['after']}")
        for b in fus["buckets"]:
            along = f" (dim {b['dim']})" if b.get("dim") is not None else ""  # all_reduce has none
            L.append(f"  {st.cyan(b['id'])}: one {b['kind']} over '{b['group']}'{along} replaces"
                     f" {len(b['members'])}: {', '.join(b['tensors'])}; packed along dim {b['pack_dim']}"
                     + (f"; on stream {b['stream']}, the members' pin" if b.get("stream") else ""))
            L.append(f"    packing: {st.green(b['packing'])}: {b['why']}")
            upper = ", ".join(f"{k}={d.hi}" for k, d in plan.dims.items())
            L.append(f"    buffers at {upper}: packed {_mib(b['packed_bytes_max'])}, result {_mib(b['out_bytes_max'])}")
        for nf in fus["not_fused"][:10]:
            L.append(st.yellow(f"  not fused: {' + '.join(nf['ops'])}: {nf['reason']}"))
        if len(fus["not_fused"]) > 10:
            L.append(f"  ... {len(fus['not_fused']) - 10} more near misses (see --emit json)")

    for lines in (describe_allreduce_norm(cp.report.get("fuse-allreduce-norm"), st),
                  describe_gemm_chains(cp.report.get("fuse-gemm-chains"), st)):
        if lines:
            L.append("")
            L += lines

    L.append("")
    L.append(st.bold("Streams") + f": {', '.join(cp.streams)}"
             + st.dim("  (main = the caller's current stream; aux streams are shared by every layer)"))
    dec = cp.report.get("assign-streams")
    if isinstance(dec, list):
        for d in dec:
            L.append(f"  {_group_labels(d['scopes'])}: {d['decision']}")
    ev = cp.report.get("derive-events")
    if isinstance(ev, dict):
        L.append(f"  events: {ev['events']} record sites, {ev['waits']} waits"
                 f" ({ev['exit_waits']} at exit to join the caller's stream)")
    L += _bucket_plan_lines(cp, st)
    free = _uncosted(cp)
    if free:
        names = ", ".join(free[:3]) + (f", ... ({len(free)} in all)" if len(free) > 3 else "")
        L.append(st.yellow(f"  model code without cost_us, rated as free (0 us): {names}"))

    if cp.variants:
        L.append("")
        L.append(st.bold("Variants") + st.dim("  (tried in order at run time; the last is the fallback)"))
        never = never_running(cp, {**cp.plan.tuned, **cfg.tuned})
        eager = eager_only(cp, {**cp.plan.tuned, **cfg.tuned})
        for rids in region_groups(cp):
            rid = rids[0]
            L.append(f"  region {group_label(rids)}:")
            for v in plan.regions[rid].variants:
                live = v in cp.variants[rid]
                gate = v.when_text if v.when is not None else "fallback"
                dead = never.get((rid, v.name)) if live else None
                mark = "" if live else st.yellow("  [removed at compile time]")
                if dead:
                    mark = st.yellow(f"  [never runs: {dead}]")
                elif live and (rid, v.name) in eager:
                    sizes = size_ranges(eager[(rid, v.name)])
                    mark = st.yellow(f"  [eager calls only: {cp.plan.token_dim} = {sizes}, between the"
                                     " buckets; a graph replay pads those to the bucket above]")
                L.append(f"    {v.name:<14} when {gate}{mark}")
        for rid, at in (cp.report.get("dce:regions") or {}).items():
            L.append(f"  region {rid}:" + st.yellow(f"  [removed with variant '{at['variant']}' of region {at['region']}]"))

    L.append("")
    L.append(st.bold("Schedule") + st.dim("  (issue order; ops of one region shown once when regions repeat)"))
    L += _schedule_lines(cp, st, full)

    cps, never = _estimates(cp, cfg) if cp.schedule else ([], [])
    if cps or never:
        L.append("")
        nm = len(cfg.profile.measured or {})
        used = cp.report.get("assign-streams:measured_used")
        measured = (f", {used} of the tuning's {nm} measured op times used" if used is not None else
                    f", {nm} measured op times from the tuning") if nm else ""
        L.append(st.bold("Estimated time per variant") + st.dim(f"  (cost model: {cfg.profile.name}{measured})"))
        dims = [", ".join(f"{k}={v}" for k, v in r["bindings"].items()) or "-" for r in cps]
        wv = max([16] + [len(r["variant"]) + 2 for r in cps])
        wd = max([22] + [len(d) + 2 for d in dims])  # several gated dims make longer bindings
        L.append(f"  {'variant':<{wv}}{'dims':<{wd}}{'serial us':>12}{'scheduled us':>15}{'gain':>8}")
        for r, b in zip(cps, dims, strict=True):
            gain = r["serial_us"] / r["scheduled_us"] if r["scheduled_us"] else 1.0
            L.append(f"  {r['variant']:<{wv}}{b:<{wd}}{r['serial_us']:>12.1f}{r['scheduled_us']:>15.1f}{gain:>7.2f}x")
            for p in cp.bucket_plans:  # the rows are of the single assignment; a range planned apart says so
                d = p["dim"]
                if p.get("cp") is not None and d in r["bindings"] and r["bindings"][d] in p["buckets"]:
                    us = p["scheduled_us"][p["buckets"].index(r["bindings"][d])]
                    gain = r["serial_us"] / us if us else 1.0
                    L.append(st.dim(f"  {'':<{wv}}{'':<{wd}}{'':>12}{us:>15.1f}{gain:>7.2f}x"
                                    f"  its own stream plan ({d} {p['lo']}..{p['hi']})"))
        for name, why in never:
            L.append(st.yellow(f"  {name}: {why}"))

    mem = cp.report.get("estimate-memory")
    if isinstance(mem, dict):
        L.append("")
        b = ", ".join(f"{k}={v}" for k, v in mem["bindings"].items())
        L.append(st.bold("Memory") + st.dim("  (activations, lifetime-based, per variant at the largest size its"
                                            " gates allow)"))
        for n, m in mem["variants"].items():
            at = ", ".join(f"{k}={v}" for k, v in m.get("bindings", mem["bindings"]).items()) or "static shapes"
            dead = st.dim("  (never runs: sized at the dims' top for the record)") if m.get("never_runs") else \
                st.dim("  (eager calls only: at the largest size between the buckets that reaches it)") \
                if m.get("eager_only") else ""
            L.append(f"  {n:<16} peak {_mib(m['peak_bytes'])} at {m['peak_at']} ({at}){dead}")
        L.append(f"  weights {_mib(mem['weights_bytes'])}, inputs {_mib(mem['inputs_bytes'])};"
                 f" fusion added {_mib(mem['fusion_added_bytes'])} (copies of members not written in place)")
    return "\n".join(L) + "\n"


def _sig(cp: Compiled, v: str) -> str:
    d = cp.graph.nodes[v]
    op = d["op"]
    shapes = ",".join(fmt_shape(cp.tensors[n].shape) + cp.tensors[n].dtype for n in op.out if n in cp.tensors)
    return f"{op.op}|{shapes}|{d['stream']}"


def _schedule_lines(cp: Compiled, st, full: bool) -> list[str]:
    g = cp.graph
    out = []
    shown: dict[str, int] = {}
    skipped = 0
    region_sig: dict[str, str] = {}
    if not full:
        parts: dict[str, list] = {}
        for v in cp.schedule:
            ctx = g.nodes[v]["ctx"]
            if ctx:
                parts.setdefault(ctx[0][0], []).append(_norm(v) + ":" + _sig(cp, v))
        region_sig = {r: str(hash(tuple(p))) for r, p in parts.items()}
    for v in cp.schedule:
        d = g.nodes[v]
        ctx = d["ctx"]
        if not full:
            # repeated layers: show the first region of a kind, and two of each repeated op; ops are
            # alike only when their names differ in numbers alone and kind, shapes and stream agree
            key = _norm(ctx[0][0] + "|" + v) if ctx else _norm(v)
            key += "|" + _sig(cp, v)
            limit = 1 if ctx else 2
            if ctx:
                rk = "region:" + _norm(ctx[0][0]) + "|" + region_sig[ctx[0][0]]
                first = shown.setdefault(rk, ctx[0][0])
                if first != ctx[0][0]:
                    skipped += 1
                    continue
            shown[key] = shown.get(key, 0) + 1
            if shown[key] > limit:
                skipped += 1
                continue
        op = d["op"]
        lane = d["stream"]
        shapes = ", ".join(fmt_shape(cp.tensors[n].shape) for n in op.out if n in cp.tensors)
        extra = []
        if d["waits"]:
            extra.append(st.yellow("wait " + ", ".join(d["waits"])))
        if d["records"]:
            extra.append(st.green("record " + ", ".join(d["records"])))
        if getattr(op, "fused_from", None):
            extra.append(st.cyan(f"fused from {len(op.fused_from)}: " + ", ".join(op.fused_from)))
        if d.get("out_slot"):
            extra.append(st.cyan(f"writes into {d['out_slot'][0]}"))
        gate = f"[{ctx[-1][1]}] " if ctx else ""
        indent = "" if lane == "main" else " " * 6
        out.append(f"  {st.dim(lane):<6} {indent}{gate}{op.op} {v} -> {shapes}" + (f"  ({'; '.join(extra)})" if extra else ""))
    if skipped:
        out.append(st.dim(f"  ... and {skipped} more ops alike in repeated regions and layers (--full lists them)"))
    if cp.exit_waits:
        out.append(f"  main   exit: {st.yellow('wait ' + ', '.join(cp.exit_waits))}")
    return out
