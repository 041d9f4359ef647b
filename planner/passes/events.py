"""schedule + derive-events: the issue order, then the minimal records and waits.

schedule — Pre: streams assigned. Post: cp.schedule lists every op once in a
deterministic topological order (plan order among ready ops).

derive-events — Pre: a schedule. Post: each op's `waits`/`records` and
cp.events/cp.exit_waits, such that every cross-stream dependency is ordered in
every call, whichever variants run, and no wait repeats what its stream already knows. Views (split/slice/view/select) do no GPU work: a reader
of a view depends on the view's producer instead, and views never wait.
Vector clocks give minimality: an op waits on stream t only if what it needs on
t is later than everything its stream already knows to be complete, and then
only on the latest such op. Knowledge learned through an event recorded inside
a variant is used only by ops that run exactly when that event is recorded.
A read of a region output (a select over the variants' results) waits on the event
of every variant's producer: only the one that ran is recorded in a call, and the
executor waits on exactly that one (planner.ordering states the model; verify
proves every cross-stream read and the exit join for every variant choice).
"""

from __future__ import annotations

import networkx as nx

from ..graph import Compiled
from ..ordering import ENTRY, ExitCover, Order, implied, is_view, real_preds

SCHEDULE = "schedule"
NAME = "derive-events"


def schedule(cp: Compiled, cfg) -> tuple[Compiled, bool]:
    index = {o.id: i for i, o in enumerate(cp.plan.ops)}
    order = list(nx.lexicographical_topological_sort(cp.graph, key=lambda v: (index.get(v, 1 << 60), v)))
    changed = order != cp.schedule
    cp.schedule = order
    per_stream = {}
    for v in order:
        per_stream.setdefault(cp.graph.nodes[v]["stream"], []).append(v)
    cp.report[SCHEDULE] = {s: len(ops) for s, ops in per_stream.items()}
    return cp, changed


def derive(cp: Compiled, cfg) -> tuple[Compiled, bool]:
    g = cp.graph
    streams = cp.streams
    memo: dict = {"_tensors": cp.tensors}
    pos: dict[str, int] = {}
    counters = {s: 0 for s in streams}
    for v in cp.schedule:
        g.nodes[v]["waits"], g.nodes[v]["records"] = [], []
        if not is_view(g, v):
            s = g.nodes[v]["stream"]
            counters[s] += 1
            pos[v] = counters[s]
    events: dict[str, dict] = {}
    clock_of: dict[str, dict] = {}
    zero = {t: 0 for t in streams} | {ENTRY: 0}
    # what a stream knows is complete, valid for any variant choice; plus per-context knowledge
    uncond = {s: dict(zero, main=0) for s in streams}
    uncond["main"][ENTRY] = 1
    in_ctx: dict[tuple, dict] = {}
    n_waits = 0

    def record(u):
        eid = f"ev.{u}"
        if eid not in events:
            events[eid] = {"op": u, "stream": g.nodes[u]["stream"]}
            g.nodes[u]["records"].append(eid)
        return eid

    for v in cp.schedule:
        if is_view(g, v):
            continue
        d = g.nodes[v]
        s, ctx = d["stream"], d["ctx"]
        known = dict(uncond[s])
        if ctx:
            for k, val in in_ctx.get((s, ctx), {}).items():
                known[k] = max(known[k], val)
        need: dict[str, list[str]] = {}
        wants_entry = False
        for u in real_preds(g, v, memo):
            if u == ENTRY:
                wants_entry = True
                continue
            t = g.nodes[u]["stream"]
            if t != s and known[t] < pos[u]:
                need.setdefault(t, []).append(u)
        for t, us in sorted(need.items()):
            # latest first: a wait on an op that runs whenever v runs covers every earlier
            # op of its stream; a wait on an op inside a variant v is not in covers them
            # only in calls where that variant ran, so every other variant's producer gets
            # its own wait (the executor waits on the one recorded in this call)
            chosen: list[str] = []
            for u in sorted(us, key=lambda x: -pos[x]):
                if known[t] >= pos[u]:
                    continue
                both = set(g.nodes[u]["ctx"]) | set(ctx)
                if any(pos[r] >= pos[u] and set(g.nodes[r]["ctx"]) <= both for r in chosen):
                    continue
                n_waits += 1
                d["waits"].append(record(u))
                chosen.append(u)
                if implied(g.nodes[u]["ctx"], ctx):
                    for k, val in clock_of[u].items():
                        known[k] = max(known[k], val)
        if wants_entry and not known[ENTRY]:
            # plan inputs were written on the caller's stream before the call
            n_waits += 1
            d["waits"].insert(0, ENTRY)
            known[ENTRY] = 1
        known[s] = pos[v]
        clock_of[v] = known
        if ctx:
            in_ctx[(s, ctx)] = known
            uncond[s][s] = pos[v]
        else:
            uncond[s] = dict(known)
    # the join: main must know every side stream's work done before returning, for every
    # choice of variants (latest first: an unguarded last op covers its whole stream)
    cp.events, cp.exit_waits = events, []
    order = Order(cp)
    cover = ExitCover(cp, order)
    exit_waits = []
    for u in reversed(order.schedule):
        if order.stream[u] != "main" and not cover.covers(u):
            exit_waits.append(record(u))
            cover.add_exit(u)
    exit_waits.reverse()
    if any(ENTRY in g.nodes[v]["waits"] for v in g.nodes):
        events[ENTRY] = {"op": None, "stream": "main"}
    cp.events = events
    cp.exit_waits = exit_waits
    cp.report[NAME] = {"events": len(events), "waits": n_waits + len(exit_waits), "exit_waits": len(exit_waits)}
    return cp, bool(events)
