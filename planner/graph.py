"""The dependency graph of a plan, and verify().

Nodes are op ids; node attributes:
  op       the pydantic op model (the payload)
  ctx      ((region, variant), ...) guards, outermost first; () = always runs
  stream   stream name (set by assign-streams; "main" before)
  waits    event ids to wait on before the op (set by derive-events)
  records  event ids recorded after the op (set by derive-events)
  cost_us  estimated time (set by the cost model)
  out_slot (packed tensor, dim, offset, size) when the op writes into a packed buffer
Edges u -> v carry `tensors`: the names v reads from u.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from .infer import InferCtx
from .ir import Plan
from .shapes import Probes, TensorSpec

__all__ = ["Compiled", "build_graph", "verify", "VerifyError", "compatible"]


class VerifyError(Exception):
    """An invariant of the compiled plan does not hold (a planner bug, not a user error)."""


@dataclass
class Compiled:
    plan: Plan
    graph: nx.DiGraph
    tensors: dict[str, TensorSpec]
    streams: list[str] = field(default_factory=lambda: ["main"])
    schedule: list[str] = field(default_factory=list)
    events: dict[str, dict] = field(default_factory=dict)  # id -> {"op", "stream"}
    exit_waits: list[str] = field(default_factory=list)     # events main waits on before returning
    variants: dict = field(default_factory=dict)            # region id -> live Variants, in order
    report: dict = field(default_factory=dict)              # pass name -> what it decided
    passes_run: list[str] = field(default_factory=list)

    @property
    def probes(self) -> Probes:
        return Probes(self.plan.dim_ranges())

    def producer(self, tensor: str) -> str | None:
        return self.tensors[tensor].producer if tensor in self.tensors else None

    def op(self, op_id: str):
        return self.graph.nodes[op_id]["op"]


def compatible(a: tuple, b: tuple) -> bool:
    """Two guard contexts can both run in one call (no region picks different variants)."""
    da = dict(a)
    return all(da.get(r, v) == v for r, v in b)


def build_graph(plan: Plan) -> Compiled:
    g = nx.DiGraph()
    tensors = dict(plan.tensors)
    for op in plan.ops:
        g.add_node(op.id, op=op, ctx=plan.op_ctx[op.id], stream=op.stream or "main", waits=[], records=[])
    for op in plan.ops:
        for name in op.inputs():
            p = tensors[name].producer
            if p is not None:
                if g.has_edge(p, op.id):
                    g.edges[p, op.id]["tensors"].append(name)
                else:
                    g.add_edge(p, op.id, tensors=[name])
    variants = {rid: list(r.variants) for rid, r in plan.regions.items()}
    streams = ["main"] + sorted({op.stream for op in plan.ops if op.stream and op.stream != "main"})
    return Compiled(plan, g, tensors, streams=streams, variants=variants)


def rebuild_edges(cp: Compiled) -> None:
    """Recompute edges from the ops' inputs (after a pass rewrote ops)."""
    g = cp.graph
    g.remove_edges_from(list(g.edges))
    for v in g.nodes:
        for name in g.nodes[v]["op"].inputs():
            p = cp.tensors[name].producer
            if p is not None:
                if g.has_edge(p, v):
                    g.edges[p, v]["tensors"].append(name)
                else:
                    g.add_edge(p, v, tensors=[name])


def verify(cp: Compiled) -> None:
    g, plan = cp.graph, cp.plan
    if not nx.is_directed_acyclic_graph(g):
        raise VerifyError(f"graph has a cycle: {nx.find_cycle(g)}")
    producers: dict[str, str] = {}
    for v, d in g.nodes(data=True):
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
            if p is not None and op.op != "select" and not _ctx_visible(g.nodes[p]["ctx"], d["ctx"]):
                raise VerifyError(f"{v} (ctx {d['ctx']}) reads {name} from another variant ({g.nodes[p]['ctx']})")
        if d["stream"] not in cp.streams:
            raise VerifyError(f"{v} is on unknown stream {d['stream']}")
    for name, t in cp.tensors.items():
        if t.producer is not None and t.producer not in g:
            raise VerifyError(f"tensor {name} has a producer {t.producer} that is not in the graph")
    for o in plan.outputs:
        if o not in cp.tensors:
            raise VerifyError(f"plan output {o} is gone")
    _verify_shapes(cp)
    if cp.schedule:
        _verify_schedule(cp, events="derive-events" in cp.passes_run)


def _ctx_visible(producer_ctx: tuple, consumer_ctx: tuple) -> bool:
    return consumer_ctx[: len(producer_ctx)] == producer_ctx


def _verify_shapes(cp: Compiled) -> None:
    plan = cp.plan
    probes = cp.probes
    ctx = InferCtx(cp.tensors, plan.params, plan.dims, plan.groups, probes)
    for v in nx.topological_sort(cp.graph):
        op = cp.graph.nodes[v]["op"]
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
            raise VerifyError(f"schedule runs {v} before its input {u}")
    if not events:
        return
    recorded: dict[str, str | None] = {"entry": None} if "entry" in cp.events else {}
    for v in cp.schedule:
        d = g.nodes[v]
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
    # every cross-stream dependency must be ordered by a chain of waits
    from .passes.events import happens_before, joined_at_exit
    hb = happens_before(cp)
    for u, v in g.edges:
        if g.nodes[u]["stream"] != g.nodes[v]["stream"] and not hb(u, v):
            raise VerifyError(f"{v} on {g.nodes[v]['stream']} reads from {u} on {g.nodes[u]['stream']} without an event")
    # and the caller's stream must know all side-stream work is done before the call returns
    missing = joined_at_exit(cp)
    if missing:
        raise VerifyError(f"side-stream work is not joined back before returning: {missing[0]}")
