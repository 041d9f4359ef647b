"""Timing analyses shared by passes and the report: bindings, critical paths, slack."""

from __future__ import annotations

import dataclasses
import itertools
import re

import networkx as nx

from .cost import CostModel
from .expr import free_names
from .graph import Compiled, compatible
from .ops import VIEW_OPS
from .predicates import Facts, compile_gate
from .sharing import exit_span, shared_simulator

__all__ = ["allowed_buckets", "possible_buckets", "why_never", "never_running", "between_buckets", "eager_only",
           "size_ranges", "running_variants", "region_groups", "group_label",
           "variant_picks", "rep_bindings", "largest_bucket", "op_costs", "per_op", "simulate",
           "simulator", "variant_choice", "issue_order", "graph_shape"]


class _AnyTensor:
    """A tensor as gates see it at plan time: the planned layout (optimistic facts)."""

    def __init__(self, spec, dims):
        self.spec, self._dims = spec, dims

    def is_contiguous(self):
        return self.spec.contiguous

    @property
    def dtype(self):
        return {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}.get(self.spec.dtype, self.spec.dtype)

    @property
    def shape(self):
        from .expr import eval_int
        return [eval_int(d, self._dims) for d in self.spec.shape]


class _LazyTensors(dict):
    def __init__(self, tensors, dims):
        super().__init__()
        self._tensors, self._dims = tensors, dims

    def __missing__(self, k):
        return _AnyTensor(self._tensors[k], self._dims)


def _optimistic_facts(cp: Compiled, dims: dict, tuned: dict) -> Facts:
    # the world a run of this plan has: its largest group (planner run binds every group to it)
    world = max([s for s in cp.plan.groups.values() if isinstance(s, int)], default=1)
    return Facts(dims=dims, capturing=True, cc=90, device="cuda", tuned=tuned, world_size=world,
                 tensors=_LazyTensors(cp.tensors, dims))


# facts an earlier variant's gate may use and still be known to hold at plan time (with every
# value of capturing and of the device); a gate over rank, tensors' layouts or dtypes is not
_SURE_FACTS = {"capturing", "cc", "device", "true", "false", "min", "max", "ceil_div"}
# the calls a plan may see, the optimistic one (inside a graph capture on the GPU) first: captured
# and eager on the GPU, eager on the CPU (no capture there)
_CALL_CASES = [(True, "cuda", 90), (False, "cuda", 90), (False, "cpu", 0)]
_CALL_FACTS = {"capturing", "device", "cc"}


def _variants(cp: Compiled) -> dict:
    return getattr(cp, "variants", None) or {r: reg.variants for r, reg in cp.plan.regions.items()}


def _gate(v, gates: dict | None):
    g = None if gates is None else gates.get(id(v.when))
    if g is None:
        g = compile_gate(v.when)
        if gates is not None:
            gates[id(v.when)] = g
    return g


_GATE_NAMES: dict[int, tuple] = {}  # id(gate expr) -> (expr, its free names): gates are walked once


def _gate_names(expr):
    hit = _GATE_NAMES.get(id(expr))
    if hit is None or hit[0] is not expr:
        if len(_GATE_NAMES) > 4096:  # bounded in a long-running process that compiles many plans
            _GATE_NAMES.clear()
        hit = _GATE_NAMES[id(expr)] = (expr, frozenset(free_names(expr)))
    return hit[1]


# worlds a plan without groups may be run in (an embedded executor uses the caller's world)
_ANY_WORLD = (1, 2, 4, 8, 16, 32, 64)


def _can_hold(g, facts, v=None, cp: Compiled | None = None) -> bool:
    """The gate of variant v at these facts: at some rank of the world where it reads `rank`, in
    some world where it reads `world_size` and the plan has no group to fix it. One that cannot be
    evaluated there (a division by zero at these sizes) is left to run time, where it fails with
    its own message. The call (capturing, device, cc) is the facts': _calls says which to try."""
    uses = set(getattr(v, "uses", ()) or ())
    worlds = [facts.world_size]
    if "world_size" in uses and cp is not None and not any(s > 1 for s in cp.plan.groups.values()):
        worlds = list(_ANY_WORLD)
    try:
        for w in worlds:
            for r in range(min(w, 1024)) if "rank" in uses else (facts.rank,):
                if g(dataclasses.replace(facts, world_size=w, rank=r)):
                    return True
        return False
    except ArithmeticError:
        return True


def _calls(facts, gated) -> list:
    """The facts of each call the gates of `gated` (variants) are judged in together: the optimistic
    call only, unless one of them reads the capture state or the device; then every call of
    _CALL_CASES, one at a time (a variant for eager calls and one for captures never run in one call)."""
    if not any(_CALL_FACTS & set(getattr(v, "uses", ()) or ()) for v in gated):
        return [facts]
    return [dataclasses.replace(facts, capturing=cap, device=dev, cc=cc) for cap, dev, cc in _CALL_CASES]


def _surely(cp: Compiled, v, b: dict, tuned: dict, gates: dict | None, calls=tuple(_CALL_CASES)) -> bool:
    """Does variant v's gate hold at bindings b in each of these calls, whatever the other run-time
    facts are?"""
    names = _gate_names(v.when)
    if any(n not in cp.plan.dims and n not in _SURE_FACTS and not n.startswith("tuned.") for n in names):
        return False
    g = _gate(v, gates)
    for cap, dev, cc in calls:
        f = Facts(dims=b, capturing=cap, cc=cc, device=dev, tuned=tuned, tensors=_LazyTensors(cp.tensors, b))
        try:
            if not g(f):
                return False
        except (KeyError, TypeError, ValueError, ArithmeticError):
            return False
    return True


def _holds(cp: Compiled, ctx: tuple, b: dict, tuned: dict, gates: dict | None = None,
           optimistic_only: bool = False, together: bool = True) -> bool:
    """Can every variant of ctx run at bindings b: its gate can hold and no variant before it in
    its region surely takes the call (a fallback never sees the sizes the gates above it always
    take)? The call is the optimistic one (a graph capture on the GPU), or any call of _CALL_CASES
    where a gate reads the capture state or the device (_calls): one call for all of ctx when
    `together`, else a call of its own for each region's variant."""
    variants = _variants(cp)
    parts = []  # per region of ctx: its variant (when gated) and the gated variants before it
    for rid, vname in ctx:
        before = []
        for v in variants.get(rid, []):
            if v.name == vname:
                parts.append(([v] if v.when is not None else [], before))
                break
            if v.when is not None:
                before.append(v)
    facts = _optimistic_facts(cp, b, tuned)

    def runs(chosen: list, before: list) -> bool:
        for f in [facts] if optimistic_only else _calls(facts, chosen + before):
            call = ((f.capturing, f.device, f.cc),)
            if not any(_surely(cp, v, b, tuned, gates, call) for v in before) and \
                    all(_can_hold(_gate(v, gates), f, v, cp) for v in chosen):
                return True
        return False
    if together:
        return runs([v for c, _ in parts for v in c], [v for _, bs in parts for v in bs])
    return all(runs(c, bs) for c, bs in parts)


def _within(cp: Compiled, rid: str) -> tuple:
    """The (region, variant) pairs region rid sits in, outermost first."""
    r = cp.plan.regions.get(rid)
    return tuple(r.within) if r is not None else ()


def why_never(cp: Compiled, rid: str, vname: str, tuned: dict) -> str | None:
    """Why variant vname of region rid takes no call at any bucket, or None when it can run: its
    gate holds at no size the dims allow, or every size where it holds is taken by the variants
    before it (named). A region nested in variants is judged at the sizes and in the calls where
    those variants run (a fallback inside 'decode' never sees the sizes 'decode' leaves out)."""
    within = _within(cp, rid)
    ctx = within + ((rid, vname),)
    if possible_buckets(cp, ctx, tuned) or between_buckets(cp, ctx, tuned):
        return None
    variants = _variants(cp).get(rid, [])
    v = next((x for x in variants if x.name == vname), None)
    if v is None:
        return None
    gates: dict = {}
    earlier = [x for x in variants[:variants.index(v)] if x.when is not None]
    outer = [x for o, n in within for x in _variants(cp).get(o, []) if x.name == n and x.when is not None]
    runs = " runs" if len(within) == 1 else " run"
    where = ", ".join(f"variant '{n}' of region {o}" for o, n in within) + runs if within else ""
    own, taken_by = False, set()
    for b in _bucket_grid(cp, ctx):
        if within and not _holds(cp, within, b, tuned, gates):
            continue  # the variants it sits in take no call here
        for f in _calls(_optimistic_facts(cp, b, tuned), [v] + earlier + outer):  # the call where it would run
            if not all(_can_hold(_gate(x, gates), f, x, cp) for x in outer):
                continue
            if v.when is not None and not _can_hold(_gate(v, gates), f, v, cp):
                continue
            own = True
            call = ((f.capturing, f.device, f.cc),)
            taken_by |= {x.name for x in earlier if _surely(cp, x, b, tuned, gates, call)}
    if not own:
        return f"its gate holds in no call where {where}" if within else "its gate holds at no size the dims allow"
    names = ", ".join(f"'{x.name}'" for x in earlier if x.name in taken_by) or "the variants"
    return f"every size where its gate holds{' while ' + where if within else ''} is taken by {names} before it"


_SCAN_LIMIT = 1 << 17  # gate evaluations a between-buckets scan may take


def between_buckets(cp: Compiled, ctx: tuple, tuned: dict) -> list[int]:
    """Sizes of the token dim, between its buckets, at which every variant of ctx can run (the
    other walked dims at their buckets), when none of its buckets does: eager calls take such a
    variant there, while a graph replay pads them to the bucket above and never does. Empty
    when a bucket holds, or the scan would exceed _SCAN_LIMIT gate evaluations."""
    lead = cp.plan.token_dim
    if lead is None or lead not in cp.plan.dims:
        return []
    d = cp.plan.dims[lead]
    values = [v for v in range(d.lo, d.hi + 1) if v not in set(d.buckets)]
    grid = {tuple(sorted((k, x) for k, x in b.items() if k != lead)): b for b in _bucket_grid(cp, ctx)}
    if not values or len(values) * len(grid) > _SCAN_LIMIT:
        return []
    gates: dict = {}
    return sorted({v for b in grid.values() for v in values if _holds(cp, ctx, {**b, lead: v}, tuned, gates)})


def eager_only(cp: Compiled, tuned: dict) -> dict[tuple[str, str], list[int]]:
    """(region, variant) -> the sizes between buckets where it runs, for every live variant of the
    first region of each group (region_groups) that runs at no bucket but runs there."""
    out = {}
    variants = _variants(cp)
    for rids in region_groups(cp):
        rid = rids[0]
        within = _within(cp, rid)
        for v in variants.get(rid, []):
            ctx = within + ((rid, v.name),)
            if not possible_buckets(cp, ctx, tuned):
                sizes = between_buckets(cp, ctx, tuned)
                if sizes:
                    out[(rid, v.name)] = sizes
    return out


def size_ranges(values: list[int]) -> str:
    """[5, 6, 7, 9] -> '5..7, 9'."""
    parts, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}..{values[j]}")
        i = j + 1
    return ", ".join(parts)


def never_running(cp: Compiled, tuned: dict) -> dict[tuple[str, str], str]:
    """(region, variant) -> why_never's reason, for every live variant of the first region of each
    group of alike regions (region_groups) that takes no call at any bucket."""
    out = {}
    variants = _variants(cp)
    for rids in region_groups(cp):
        for v in variants.get(rids[0], []):
            why = why_never(cp, rids[0], v.name, tuned)
            if why:
                out[(rids[0], v.name)] = why
    return out


MAX_COMBOS = 32  # variant combinations estimated when regions differ (beyond: one name at a time)


def region_groups(cp: Compiled) -> list[list[str]]:
    """Regions grouped when they are alike: names equal up to their numbers (layer indices)
    and the same variants with the same gates (numbers inside names aside, thresholds not)."""
    seen: dict[str, list[str]] = {}
    for rid, vs in _variants(cp).items():
        gates = "|".join(f"{v.name}:{v.when_text}" for v in vs)
        seen.setdefault(re.sub(r"\d+", "#", rid) + "|" + re.sub(r"(?<=[A-Za-z_])\d+", "#", gates), []).append(rid)
    return list(seen.values())


def group_label(rids: list[str]) -> str:
    return rids[0] if len(rids) == 1 else f"{rids[0]} (+{len(rids) - 1} alike)"


def _active(cp: Compiled, choice: dict) -> dict:
    """The regions of a choice that take part in it: those whose enclosing variants it picks (a
    region inside 'decode' plays no part in a call that runs 'prefill')."""
    return {r: n for r, n in choice.items()
            if all(choice.get(o) == v for o, v in _within(cp, r))}


def variant_picks(cp: Compiled) -> list[tuple[str, dict, bool]]:
    """(label, region -> variant, together) of every variant combination the estimate covers:
    every combination of the groups' variants (up to MAX_COMBOS), each judged as one call
    (together); else one name at a time (all regions alike: repeated layers take the same variant;
    or too many combinations), a label over regions each judged in the calls it runs in. A region
    nested in a variant the combination does not pick is left out of it (and of its label), so
    each combination is listed once."""
    groups = region_groups(cp)
    if not groups:
        return [("(plan)", {}, True)]
    variants = _variants(cp)
    combos = 1
    for rids in groups:
        combos *= len(variants[rids[0]])
    out, seen = [], set()
    if len(groups) == 1 or combos > MAX_COMBOS:
        names = sorted({v.name for vs in variants.values() for v in vs})
        for n in names:
            choice = variant_choice(cp, n)
            key = tuple(sorted(choice.items()))
            if key not in seen:
                seen.add(key)
                out.append((n, choice, False))
        return out
    for pick in itertools.product(*([v.name for v in variants[rids[0]]] for rids in groups)):
        choice = _active(cp, {rid: name for rids, name in zip(groups, pick, strict=True) for rid in rids})
        key = tuple(sorted(choice.items()))
        if key in seen:
            continue
        seen.add(key)
        label = ", ".join(f"{group_label(rids)}={name}" for rids, name in zip(groups, pick, strict=True)
                          if rids[0] in choice)
        out.append((label, choice, True))
    return out


def running_variants(cp: Compiled, b: dict, tuned: dict) -> dict[str, str]:
    """Region -> the variant that takes a call at bindings b in the call the planner optimizes for
    (inside a graph capture on the GPU): the first whose gate can hold there and that no variant
    before it takes."""
    out = {}
    gates: dict = {}
    for rid, vs in _variants(cp).items():
        for v in vs:
            if _holds(cp, ((rid, v.name),), b, tuned, gates, optimistic_only=True):
                out[rid] = v.name
                break
        else:
            out[rid] = vs[-1].name
    return out


def _walked_dims(cp: Compiled, ctx: tuple) -> list[str]:
    """The dims whose buckets a scope is rated at: the token dim (Plan.token_dim: the count every
    cost scales with) and every dim a gate of ctx, or of a variant before it, names."""
    names = list(cp.plan.dims)
    lead = cp.plan.token_dim
    used = set()
    variants = _variants(cp)
    for rid, vname in ctx:
        for v in variants.get(rid, []):
            if v.when is not None:
                used |= _gate_names(v.when)
            if v.name == vname:
                break
    return [n for n in names if n == lead or n in used]


def _bucket_grid(cp: Compiled, ctx: tuple) -> list[dict]:
    plan = cp.plan
    walked = _walked_dims(cp, ctx)
    top = {n: plan.dims[n].hi for n in plan.dims}
    return [{**top, **dict(zip(walked, combo, strict=True))}
            for combo in itertools.product(*(plan.dims[n].buckets for n in walked))]


def possible_buckets(cp: Compiled, ctx: tuple, tuned: dict, together: bool = True) -> list[dict]:
    """The buckets (see allowed_buckets) at which every variant of ctx can run (in one call, or
    each in a call of its own where not `together`: variant_picks' one name at a time); empty when
    the variants of ctx never run (together)."""
    if not cp.plan.dims:
        return [{}]
    gates: dict = {}  # one compiled gate per variant (repeated layers share the same few)
    return [b for b in _bucket_grid(cp, ctx) if _holds(cp, ctx, b, tuned, gates, together=together)]


def allowed_buckets(cp: Compiled, ctx: tuple, tuned: dict, together: bool = True) -> list[dict]:
    """Dim bindings (from the dims' buckets) under which every gate of `ctx` can hold: the
    buckets of the walked dims (_walked_dims), the other dims at their maximum (all of them
    when no bucket holds, so a scope is always rated somewhere)."""
    if not cp.plan.dims:
        return [{}]
    return possible_buckets(cp, ctx, tuned, together) or _bucket_grid(cp, ctx)


def rep_bindings(cp: Compiled, ctx: tuple, tuned: dict) -> dict:
    """The median allowed bucket: the size the planner optimizes a scope for."""
    b = allowed_buckets(cp, ctx, tuned)
    return b[len(b) // 2]


def largest_bucket(cp: Compiled, ctx: tuple, tuned: dict, together: bool = True) -> dict:
    """The largest size a scope's gates allow (where its memory peaks): the largest allowed
    bucket, each walked dim raised towards its next bucket while the gates still hold
    (num_tokens < 16 -> 15)."""
    allowed = allowed_buckets(cp, ctx, tuned, together)
    top = dict(allowed[-1])
    if not cp.plan.dims:
        return top
    for name in _walked_dims(cp, ctx):
        d = cp.plan.dims[name]
        above = [x for x in d.buckets if x > top[name]]
        lo, hi = top[name], (above[0] if above else d.hi + 1)
        while hi - lo > 1:  # gates over a dim are monotone between two buckets in every shipped form
            mid = (lo + hi) // 2
            if _holds(cp, ctx, {**top, name: mid}, tuned, together=together):
                lo = mid
            else:
                hi = mid
        top[name] = lo
    return top


def issue_order(cp: Compiled) -> list[str]:
    """The order the schedule pass issues ops in (plan order among ready ops)."""
    index = {o.id: i for i, o in enumerate(cp.plan.ops)}
    return list(nx.lexicographical_topological_sort(cp.graph, key=lambda v: (index.get(v, 1 << 60), v)))


def op_costs(cp: Compiled, model: CostModel, bindings: dict) -> dict[str, float]:
    return {v: model.op_us(d["op"], cp.tensors, bindings) for v, d in cp.graph.nodes(data=True)}


def per_op(cp: Compiled, measure):
    """at(nodes, binding) -> {op: measure(op, tensors, binding)}: model.op_us (time) or model.op_bytes
    (the HBM traffic ops running at once share); views cost nothing, so the model is skipped for
    them. Each op is measured once per binding: scopes and the variant check ask again."""
    t = cp.tensors
    ops = {v: d["op"] for v, d in cp.graph.nodes(data=True)}
    memo: dict[tuple, dict] = {}  # binding -> op -> value

    def at(nodes, b):
        known = memo.setdefault(tuple(b.items()), {})
        out = {}
        for v in nodes:
            x = known.get(v)
            if x is None:
                op = ops[v]
                x = known[v] = 0.0 if op.op in VIEW_OPS else measure(op, t, b)
            out[v] = x
        return out
    return at


def variant_choice(cp: Compiled, name: str | None) -> dict[str, str]:
    """Region -> variant: `name` where the region has it (and the variants that region sits in,
    where that picks no region two ways), else the fallback; regions nested in variants it does
    not pick are left out (_active)."""
    variants = _variants(cp)
    out = {rid: name for rid, vs in variants.items() if any(v.name == name for v in vs)}
    for rid in list(out):
        within = _within(cp, rid)
        if all(out.get(o, v) == v for o, v in within):
            out.update(within)
    for rid, vs in variants.items():
        out.setdefault(rid, vs[-1].name)
    return _active(cp, out)


def simulate(cp: Compiled, costs: dict, choice: dict | None = None, event_us: float = 1.0,
             order: list | None = None, assign: dict | None = None, shape: tuple | None = None,
             demand: dict | None = None, bytes_per_us: float = 0.0) -> tuple[float, dict]:
    """Makespan of the schedule on its streams; ops outside `choice` (or not in `order`) are skipped.

    With `demand` (op -> HBM bytes) and the bandwidth `bytes_per_us`, ops running at once share
    the bandwidth (sharing.simulate_shared); without, overlap is free.

    Streams run their ops in issue order; a cross-stream dependency costs event_us, and so
    do the fork (a side stream's first op waits for the caller's stream) and the join of
    side-stream work back to main. `assign` (op -> stream) overrides the graph's streams, so
    assign-streams rates a candidate with the same model the report uses; `shape` is
    graph_shape(cp, order) precomputed, for callers that rate many candidates.
    Returns (makespan, finish time per op).
    """
    g = cp.graph
    order = order or cp.schedule or list(nx.topological_sort(g))
    if choice is not None:
        ctx_choice = tuple(sorted(choice.items()))
        order = [v for v in order if compatible(ctx_choice, g.nodes[v]["ctx"])]
    return simulator(cp, order, event_us, assign, shape, bytes_per_us)(costs, demand)


def simulator(cp: Compiled, order: list, event_us: float = 1.0, assign: dict | None = None,
              shape: tuple | None = None, bytes_per_us: float = 0.0):
    """simulate() of one schedule at many costs (the buckets of a scope): run(costs, demand=None)
    gives simulate(cp, costs, event_us=event_us, order=order, assign=assign, shape=shape,
    demand=demand, bytes_per_us=bytes_per_us), the schedule's bookkeeping done once.
    `assign` must not change while run is used."""
    g = cp.graph
    preds, views = shape or graph_shape(cp, order)
    streams = assign if assign is not None else {v: g.nodes[v]["stream"] for v in order}
    multi = len({streams[v] for v in order if v not in views}) > 1
    shared = []  # the bandwidth-sharing simulator, made on first use

    def run(costs: dict, demand: dict | None = None) -> tuple[float, dict]:
        if demand and bytes_per_us > 0 and multi:
            if not shared:
                shared.append(shared_simulator(order, preds, views, streams, bytes_per_us, event_us))
            return shared[0](costs, demand)
        return _simulate_free(order, preds, views, streams, costs, event_us)
    return run


def _simulate_free(order, preds, views, streams, costs, event_us) -> tuple[float, dict]:
    free: dict[str, float] = {}
    finish: dict[str, float] = {}
    real: dict[str, str | None] = {}  # the stream whose work a value waits for (views do no work)
    for v in order:
        ps = [u for u in preds[v] if u in finish]
        if v in views:
            last = max(ps, key=lambda u: finish[u], default=None)
            finish[v] = finish[last] if last is not None else 0.0
            real[v] = real[last] if last is not None else None
            continue
        s = streams[v]
        start = free.get(s)
        if start is None:
            start = event_us if s != "main" else 0.0  # the fork
        for u in ps:
            extra = event_us if real[u] not in (None, s) else 0.0
            start = max(start, finish[u] + extra)
        finish[v] = start + costs[v]
        free[s] = finish[v]
        real[v] = s
    return exit_span(order, preds, real, finish, event_us), finish


def graph_shape(cp: Compiled, order: list) -> tuple[dict, set]:
    """(predecessors per op, the views) of `order`, for simulate."""
    g = cp.graph
    pred, nodes = g.pred, g.nodes
    return {v: list(pred[v]) for v in order}, {v for v in order if nodes[v]["op"].op in VIEW_OPS}
