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
    """(makespan, finish time per op); demand: op -> HBM bytes; bytes_per_us: the bandwidth."""
    queue: dict[str, list] = {}
    for v in order:
        if v not in views:
            queue.setdefault(streams[v], []).append(v)
    pos = {s: 0 for s in queue}
    free = {s: (0.0 if s == "main" else event_us) for s in queue}  # the fork
    finish: dict[str, float] = {}
    real: dict[str, str | None] = {}
    running: dict[str, float] = {}  # op -> standalone us left
    waiting: dict[str, float] = {}  # head op -> the time its inputs (and events) are ready
    pending_views = [v for v in order if v in views]
    transfer, bytes_per_us_of = {}, {}
    for v in order:
        c, nb = costs.get(v, 0.0), demand.get(v, 0.0)
        transfer[v] = min(c, nb / bytes_per_us) if nb > 0 else 0.0
        bytes_per_us_of[v] = nb / transfer[v] if transfer[v] > 0 else 0.0
    t = 0.0

    def settle_views():
        changed = True
        while changed and pending_views:
            changed = False
            for v in list(pending_views):
                ps = [u for u in preds[v] if u in pos_of]
                if all(u in finish for u in ps):
                    last = max(ps, key=lambda u: finish[u], default=None)
                    finish[v] = finish[last] if last is not None else 0.0
                    real[v] = real[last] if last is not None else None
                    pending_views.remove(v)
                    changed = True

    pos_of = set(order)
    while True:
        settle_views()
        for s, q in queue.items():
            if pos[s] >= len(q):
                continue
            v = q[pos[s]]
            if v in running or v in waiting:
                continue
            ps = [u for u in preds[v] if u in pos_of]
            if not all(u in finish for u in ps):
                continue
            start = free[s]
            for u in ps:
                start = max(start, finish[u] + (event_us if real[u] not in (None, s) else 0.0))
            waiting[v] = start
        for v, start in list(waiting.items()):
            if start <= t + _EPS:
                del waiting[v]
                running[v] = costs[v]
        if not running and not waiting:
            break
        if not running:
            t = min(waiting.values())
            continue
        # running[v] is the standalone us left; the last transfer[v] of it is the transfer part
        moving = [v for v in running if running[v] <= transfer[v] + _EPS]
        asked = sum(bytes_per_us_of[v] for v in moving)
        share = min(1.0, max([bytes_per_us] + [bytes_per_us_of[v] for v in moving]) / asked) if asked > 0 else 1.0
        rate = {v: (share if v in moving else 1.0) for v in running}
        dt = min((running[v] - transfer[v]) if v not in moving else running[v] / rate[v] for v in running)
        if waiting:
            dt = min(dt, min(waiting.values()) - t)
        dt = max(dt, 0.0)
        t += dt
        for v in list(running):
            running[v] -= dt * rate[v]
            if running[v] <= _EPS * max(1.0, costs[v]):
                del running[v]
                s = streams[v]
                finish[v], real[v], free[s] = t, s, t
                pos[s] += 1
    settle_views()
    span = max(finish.values(), default=0.0)
    if any(r not in (None, "main") for r in real.values()):
        span += event_us  # the join back to the caller's stream
    return span, finish
