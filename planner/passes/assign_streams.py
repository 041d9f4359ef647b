"""assign-streams: put independent branches on a small pool of streams.

Pre: fusion done. Post: every op has `stream` in cp.streams. The pool is
"main" (the caller's current stream) plus num_streams-1 aux streams shared by
every layer: never a stream per layer. Explicit `stream:` annotations are
honoured. Collectives and opaque `extern` ops stay on main unless pinned (one
communicator must not be driven from two streams; opaque code may use streams of
its own). Views follow their input.

Each variant context is scheduled on its own with a list scheduler (highest
upward rank first, each op on the stream where it finishes earliest, a
cross-stream dependency costing one event). If the resulting makespan does not
beat the single-stream time by cfg.min_gain_us, the scope stays on main and
the report says why. This pass only annotates: derive-events turns the
annotations into records and waits.
"""

from __future__ import annotations

import heapq

from ..analysis import rep_bindings
from ..cost import CostModel
from ..graph import Compiled
from ..ops import COLLECTIVES, VIEW_OPS

NAME = "assign-streams"
STAY_ON_MAIN = COLLECTIVES | {"extern"}


def pool(n: int) -> list[str]:
    return ["main"] + (["aux"] if n == 2 else [f"aux{i}" for i in range(1, n)])


def run(cp: Compiled, cfg) -> tuple[Compiled, bool]:
    g = cp.graph
    streams = pool(max(1, cfg.num_streams))
    pinned = {v: d["op"].stream for v, d in g.nodes(data=True) if d["op"].stream}
    for s in pinned.values():
        if s not in streams:
            streams.append(s)
    cp.streams = streams
    model = CostModel(cfg.profile, cp.plan.groups)
    tuned = {**cp.plan.tuned, **cfg.tuned}
    scopes: dict[tuple, list[str]] = {}
    for v, d in g.nodes(data=True):
        scopes.setdefault(d["ctx"], []).append(v)
    decisions: dict[str, list] = {}
    changed = False
    for ctx, nodes in scopes.items():
        binding = rep_bindings(cp, ctx, tuned)
        costs = {v: model.op_us(g.nodes[v]["op"], cp.tensors, binding) for v in nodes}
        assign, span, serial = _schedule(cp, nodes, costs, streams, pinned, cfg.profile.event_us)
        used = sorted({s for s in assign.values() if s != "main"})
        label = " / ".join(f"{r}:{v}" for r, v in ctx) or "(always)"
        if used and not any(v in pinned for v in nodes) and serial - span < cfg.min_gain_us:
            msg = (f"kept on main: {len(used)} extra stream(s) would give {span:.1f} us vs {serial:.1f} us"
                   f" serial; the fork/join does not pay (min gain {cfg.min_gain_us:g} us)")
            assign = {v: pinned.get(v, "main") for v in nodes}
        elif used:
            moved = sum(1 for v in nodes if assign[v] != "main" and costs[v] > 0)
            msg = (f"{moved} op(s) on {', '.join(used)}: {span:.1f} us vs {serial:.1f} us serial"
                   f" (saves {serial - span:.1f} us at {_fmt_binding(binding)})")
        else:
            msg = f"single stream: no independent work worth overlapping ({serial:.1f} us)"
        decisions.setdefault(msg, []).append(label)
        for v in nodes:
            if g.nodes[v]["stream"] != assign[v]:
                g.nodes[v]["stream"] = assign[v]
                changed = True
    cp.report[NAME] = [{"scopes": labels, "decision": msg} for msg, labels in decisions.items()]
    return cp, changed


def _fmt_binding(b: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in b.items()) or "static shapes"


def _schedule(cp: Compiled, nodes: list[str], costs: dict, streams: list[str], pinned: dict, ev: float):
    g = cp.graph
    inside = set(nodes)
    # upward rank: longest remaining path
    rank: dict[str, float] = {}
    order = _topo(g, nodes, inside)
    for v in reversed(order):
        rank[v] = costs[v] + max((rank[s] for s in g.successors(v) if s in inside), default=0.0)
    indeg = {v: sum(1 for u in g.predecessors(v) if u in inside) for v in nodes}
    pos = {v: i for i, v in enumerate(order)}
    ready = [(-rank[v], pos[v], v) for v in nodes if indeg[v] == 0]
    heapq.heapify(ready)
    free = {s: 0.0 for s in streams}
    finish: dict[str, float] = {}
    assign: dict[str, str] = {}
    real: dict[str, list] = {}  # views do no work: their readers depend on the views' producers
    while ready:
        _, _, v = heapq.heappop(ready)
        op = g.nodes[v]["op"]
        preds = []
        for u in g.predecessors(v):
            if u in inside:
                preds += real[u] if u in real else [u]
        outside = g.in_degree(v) > sum(1 for u in g.predecessors(v) if u in inside) or not op.inputs() or any(
            cp.tensors[n].producer is None for n in op.inputs())
        if op.op in VIEW_OPS and v not in pinned:
            real[v] = preds
            finish[v] = max((finish[u] for u in preds), default=0.0)
            assign[v] = assign[preds[0]] if preds else "main"
        else:
            if v in pinned:
                options = [pinned[v]]
            elif op.op in STAY_ON_MAIN:
                options = ["main"]
            else:
                options = streams
            best = None
            for s in options:
                start = free[s]
                for u in preds:
                    start = max(start, finish[u] + (ev if assign[u] != s else 0.0))
                if s != "main" and outside:
                    start = max(start, ev)  # fork: wait for the caller's stream
                f = start + costs[v]
                if best is None or f < best[0] - 1e-9:
                    best = (f, s)
            finish[v], assign[v] = best
            free[best[1]] = best[0]
        for s in g.successors(v):
            if s in inside:
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(ready, (-rank[s], pos[s], s))
    span = max(finish.values(), default=0.0)
    if any(s != "main" for s in assign.values()):
        span += ev
    serial = sum(costs.values())
    return assign, span, serial


def _topo(g, nodes, inside):
    indeg = {v: sum(1 for u in g.predecessors(v) if u in inside) for v in nodes}
    idx = {v: i for i, v in enumerate(nodes)}
    ready = [(idx[v], v) for v in nodes if indeg[v] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, v = heapq.heappop(ready)
        out.append(v)
        for s in g.successors(v):
            if s in inside:
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(ready, (idx[s], s))
    return out
