"""verify(): the invariants of a compiled plan, checked between passes and before anything runs.

Structure (acyclic, one producer per tensor, edges for every read, reads only from
visible variants, known streams), shapes (every op re-infers to what is recorded) and,
once there is a schedule, order (topological) and events (every cross-stream read is
ordered by a chain of waits; side-stream work is joined before the call returns).
"""

from __future__ import annotations

import networkx as nx

from .graph import Compiled
from .hazards import check_hazards
from .infer import InferCtx
from .ordering import ENTRY, Order, happens_before, joined_at_exit, real_preds

__all__ = ["verify", "VerifyError"]


class VerifyError(Exception):
    """An invariant of the compiled plan does not hold (a planner bug, not a user error)."""


def verify(cp: Compiled) -> Order | None:
    """Raise VerifyError on the first broken invariant; returns the ordering it proved (or None)."""
    g, plan = cp.graph, cp.plan
    # with a schedule, every edge running forward in it (checked below) proves acyclicity
    if not cp.schedule and not nx.is_directed_acyclic_graph(g):
        raise VerifyError(f"graph has a cycle: {nx.find_cycle(g)}")
    producers: dict[str, str] = {}
    nodes = dict(g.nodes(data=True))
    for v, d in nodes.items():
        op = d["op"]
        if op.id != v:
            raise VerifyError(f"node {v} carries op {op.id}")
        for name in op.out:
            if name in producers:
                raise VerifyError(f"tensor {name} has two producers: {producers[name]} and {v}")
            producers[name] = v
            if name not in cp.tensors or cp.tensors[name].producer != v:
                raise VerifyError(f"tensor {name} is not recorded as produced by {v}")
        for name in op.inputs():
            if name not in cp.tensors:
                raise VerifyError(f"{v} reads undefined tensor {name}")
            p = cp.tensors[name].producer
            if p is not None and not g.has_edge(p, v):
                raise VerifyError(f"missing edge {p} -> {v} for {name}")
            if p is not None and op.op != "select" and not _ctx_visible(nodes[p]["ctx"], d["ctx"]):
                raise VerifyError(f"{v} (ctx {d['ctx']}) reads {name} from another variant ({nodes[p]['ctx']})")
        if d["stream"] not in cp.streams:
            raise VerifyError(f"{v} is on unknown stream {d['stream']}")
    for name, t in cp.tensors.items():
        if t.producer is not None and t.producer not in g:
            raise VerifyError(f"tensor {name} has a producer {t.producer} that is not in the graph")
    for o in plan.outputs:
        if o not in cp.tensors:
            raise VerifyError(f"plan output {o} is gone")
    _verify_shapes(cp)
    order = _verify_schedule(cp, events="derive-events" in cp.passes_run) if cp.schedule else None
    check_hazards(cp, order)  # cross-stream buffer hazards, collective order, capture legality (planner.hazards)
    for p in cp.bucket_plans:  # each range's own stream plan (passes/bucket_plans.py) is proven the same way
        if p.get("cp") is not None:
            try:
                verify(p["cp"])
            except VerifyError as exc:
                raise VerifyError(f"the stream plan of {p['dim']} {p['lo']}..{p['hi']}: {exc}") from None
    return order


def _ctx_visible(producer_ctx: tuple, consumer_ctx: tuple) -> bool:
    return consumer_ctx[: len(producer_ctx)] == producer_ctx


def _verify_shapes(cp: Compiled) -> None:
    plan = cp.plan
    probes = cp.probes
    ctx = InferCtx(cp.tensors, plan.params, plan.dims, plan.groups, probes)
    for v, d in cp.graph.nodes(data=True):  # inference reads recorded specs: any order will do
        op = d["op"]
        try:
            specs = op.infer(ctx)
        except Exception as exc:  # noqa: BLE001 - any failure here is an invariant violation
            raise VerifyError(f"{v}: shape inference fails after planning: {getattr(exc, 'message', exc)}") from None
        for s in specs:
            t = cp.tensors[s.name]
            same = len(s.shape) == len(t.shape) and all(probes.equal(a, b) for a, b in zip(s.shape, t.shape, strict=True))
            if not same or s.dtype != t.dtype:
                raise VerifyError(f"{v}: {s.name} is recorded as {t.shape} {t.dtype} but infers to {s.shape} {s.dtype}")


def _verify_schedule(cp: Compiled, events: bool) -> None:
    g = cp.graph
    if sorted(cp.schedule) != sorted(g.nodes):
        raise VerifyError("schedule does not list every op exactly once")
    pos = {v: i for i, v in enumerate(cp.schedule)}
    for u, v in g.edges:
        if pos[u] >= pos[v]:
            if not nx.is_directed_acyclic_graph(g):
                raise VerifyError(f"graph has a cycle: {nx.find_cycle(g)}")
            raise VerifyError(f"schedule runs {v} before its input {u}")
    if not events:
        return None
    recorded: dict[str, str | None] = {"entry": None} if "entry" in cp.events else {}
    nodes = dict(g.nodes(data=True))
    for v in cp.schedule:
        d = nodes[v]
        for e in d["waits"]:
            if e not in recorded:
                raise VerifyError(f"{v} waits on event {e} that is not recorded before it")
        for e in d["records"]:
            if e not in cp.events or cp.events[e]["op"] != v:
                raise VerifyError(f"{v} records unknown event {e}")
            recorded[e] = v
    for e in cp.exit_waits:
        if e not in recorded:
            raise VerifyError(f"exit waits on event {e} that is never recorded")
    # every cross-stream dependency must be ordered by a chain of waits, in every call
    order = Order(cp)
    hb = happens_before(cp, order)
    stream = {v: d["stream"] for v, d in g.nodes(data=True)}
    for u, v in g.edges:
        if stream[u] != stream[v] and not hb(u, v):
            raise VerifyError(f"{v} on {stream[v]} reads from {u} on {stream[u]} without an event")
    # reads of plan inputs on side streams: ordered after the call's start on main
    memo: dict = {"_tensors": cp.tensors}
    for v in order.schedule:
        if order.stream[v] != "main" and ENTRY in real_preds(g, v, memo) and not order.hb(ENTRY, v):
            raise VerifyError(f"{v} on {order.stream[v]} reads a plan input without waiting on the call's entry")
    # and the caller's stream must know all side-stream work is done before the call returns
    missing = joined_at_exit(cp, order)
    if missing:
        raise VerifyError(f"side-stream work is not joined back before returning: {missing[0]}"
                          f" on {g.nodes[missing[0]]['stream']} (ctx {g.nodes[missing[0]]['ctx']})")
    return order
