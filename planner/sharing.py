"""Makespan of a multi-stream schedule whose ops share the GPU's HBM bandwidth.

An op alone takes `cost` us and moves `bytes` through HBM. It is modelled in two phases: a
latency part (launch, ramp, tail: cost - bytes / bandwidth, needing no bandwidth) and a
transfer part (bytes / bandwidth at the full bandwidth). Latency parts of ops on different
streams overlap freely; transfer parts running at once split the bandwidth. So two GEMMs that
each stream their weights at the floor overlap only their latency parts, and latency-bound
kernels (norms, small GEMMs, model code) overlap fully. Streams run their ops in issue order;
a cross-stream dependency, the fork of a side stream and the join back to main cost event_us
each, as in analysis.simulate (which this equals when no two transfer parts meet).
"""

from __future__ import annotations

__all__ = ["simulate_shared"]

_EPS = 1e-9


def simulate_shared(order: list, preds: dict, views: set, streams: dict, costs: dict, demand: dict,
                    bytes_per_us: float, event_us: float) -> tuple[float, dict]:
    """(makespan, finish time per op); demand: op -> HBM bytes; bytes_per_us: the bandwidth.
    Event-driven: O(ops + edges) bookkeeping, plus the few ops running at once per event."""
    inside = set(order)
    ps = {v: [u for u in preds[v] if u in inside] for v in order}
    succ: dict[str, list] = {v: [] for v in order}
    for v in order:
        for u in ps[v]:
            succ[u].append(v)
    left = {v: len(ps[v]) for v in order}  # unfinished inputs
    queue: dict[str, list] = {}
    for v in order:
        if v not in views:
            queue.setdefault(streams[v], []).append(v)
    pos = {s_: 0 for s_ in queue}
    free = {s_: (0.0 if s_ == "main" else event_us) for s_ in queue}  # the fork
    transfer, rate_alone = {}, {}
    for v in order:
        c, nb = costs.get(v, 0.0), demand.get(v, 0.0)
        transfer[v] = min(c, nb / bytes_per_us) if nb > 0 else 0.0
        rate_alone[v] = nb / transfer[v] if transfer[v] > 0 else 0.0
    finish: dict[str, float] = {}
    real: dict[str, str | None] = {}
    running: dict[str, float] = {}  # op -> standalone us left (its last transfer[v] is the transfer)
    waiting: dict[str, float] = {}  # stream head -> when its inputs (and their events) are ready
    check = set(queue)

    def done(v, t_end, where):
        finish[v], real[v] = t_end, where
        stack = [v]
        while stack:
            u = stack.pop()
            for w in succ[u]:
                left[w] -= 1
                if left[w] == 0 and w in views:  # a view is done when its input is
                    last = max(ps[w], key=lambda x: finish[x], default=None)
                    finish[w] = finish[last] if last is not None else 0.0
                    real[w] = real[last] if last is not None else None
                    stack.append(w)
                elif left[w] == 0:
                    check.add(streams[w])

    for v in order:  # views without inputs inside the order
        if v in views and left[v] == 0 and v not in finish:
            done(v, 0.0, None)
    t = 0.0
    while True:
        for s_ in list(check):
            q = queue[s_]
            if pos[s_] < len(q):
                v = q[pos[s_]]
                if v not in running and v not in waiting and left[v] == 0:
                    start = free[s_]
                    for u in ps[v]:
                        start = max(start, finish[u] + (event_us if real[u] not in (None, s_) else 0.0))
                    waiting[v] = start
        check.clear()
        for v, start in list(waiting.items()):
            if start <= t + _EPS:
                del waiting[v]
                running[v] = costs.get(v, 0.0)
        if not running:
            if not waiting:
                break
            t = min(waiting.values())
            continue
        moving = [v for v in running if running[v] <= transfer[v] + _EPS]
        asked = sum(rate_alone[v] for v in moving)
        share = min(1.0, max([bytes_per_us] + [rate_alone[v] for v in moving]) / asked) if asked > 0 else 1.0
        rate = {v: (share if v in moving else 1.0) for v in running}
        dt = min((running[v] - transfer[v]) if v not in moving else running[v] / rate[v] for v in running)
        if waiting:
            dt = min(dt, min(waiting.values()) - t)
        dt = max(dt, 0.0)
        t += dt
        for v in list(running):
            running[v] -= dt * rate[v]
            if running[v] <= _EPS * max(1.0, costs.get(v, 0.0)):
                del running[v]
                s_ = streams[v]
                free[s_] = t
                pos[s_] += 1
                check.add(s_)
                done(v, t, s_)
    span = max(finish.values(), default=0.0)
    if any(r not in (None, "main") for r in real.values()):
        span += event_us  # the join back to the caller's stream
    return span, finish
