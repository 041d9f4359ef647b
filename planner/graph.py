"""The dependency graph of a plan (verify() is planner.verify).

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

from .ir import Plan
from .shapes import Probes, TensorSpec

__all__ = ["Compiled", "build_graph", "rebuild_edges", "compatible", "storage_root"]


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
    bucket_ranges: list = field(default_factory=list)       # assign-streams' per-range assignments
    bucket_plans: list = field(default_factory=list)        # per-range stream plans (passes/bucket_plans.py)
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


def storage_root(cp: Compiled, name: str, via: dict | None = None) -> str:
    """The tensor whose storage `name` is: through views, and through region outputs to the
    value of the variant that ran (via: {select output: chosen input})."""
    via = via or {}
    for _ in range(64):
        if name in via:
            name = via[name]
        elif name in cp.tensors and cp.tensors[name].alias_of:
            name = cp.tensors[name].alias_of
        else:
            break
    return name


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
