"""Makespan of a multi-stream schedule whose ops share the GPU's HBM bandwidth.

An op alone takes `cost` us and moves `bytes` through HBM (a compute-bound GEMM: the bytes its
math time would move, planner.cost.CostModel.op_demand). It is modelled in two phases: a
latency part (launch, ramp, tail: cost - bytes / bandwidth, needing no bandwidth) and a
transfer part (bytes / bandwidth at the full bandwidth). Latency parts of ops on different
streams overlap freely; transfer parts running at once split the bandwidth. So two GEMMs that
each stream their weights at the floor overlap only their latency parts, and latency-bound
kernels (norms, small GEMMs, model code) overlap fully. Streams run their ops in issue order;
a cross-stream dependency, the fork of a side stream and the join back to main cost event_us
each, as in analysis.simulate (which this equals when no two transfer parts meet).
"""

from __future__ import annotations

__all__ = ["simulate_shared", "shared_simulator", "exit_span"]

_EPS = 1e-9


def simulate_shared(order: list, preds: dict, views: set, streams: dict, costs: dict, demand: dict,
                    bytes_per_us: float, event_us: float) -> tuple[float, dict]:
    """(makespan, finish time per op); demand: op -> HBM bytes; bytes_per_us: the bandwidth.
    Event-driven: O(ops + edges) bookkeeping, plus the few ops running at once per event."""
    return shared_simulator(order, preds, views, streams, bytes_per_us, event_us)(costs, demand)


def shared_simulator(order: list, preds: dict, views: set, streams: dict, bytes_per_us: float, event_us: float):
    """simulate_shared for one schedule at many costs: the graph bookkeeping is done once, and the
    returned run(costs, demand) gives simulate_shared's result. `streams` must not change meanwhile."""
    inside = set(order)
    ps: dict[str, list] = {}
    succ: dict[str, list] = {v: [] for v in order}
    left0: dict[str, int] = {}  # inputs inside the order
    queue: dict[str, list] = {}
    for v in order:
        p = [u for u in preds[v] if u in inside]
        ps[v] = p
        left0[v] = len(p)
        for u in p:
            succ[u].append(v)
        if v not in views:
            queue.setdefault(streams[v], []).append(v)
    ops = [v for q in queue.values() for v in q]
    roots = [v for v in order if v in views and left0[v] == 0]  # views without inputs inside the order
    stream_of = {v: streams[v] for v in ops}

    def run(costs: dict, demand: dict) -> tuple[float, dict]:
        left = dict(left0)  # unfinished inputs
        pos = {s_: 0 for s_ in queue}
        free = {s_: (0.0 if s_ == "main" else event_us) for s_ in queue}  # the fork
        transfer, rate_alone, cost, gone = {}, {}, {}, {}
        for v in ops:
            c, nb = costs.get(v, 0.0), demand.get(v, 0.0)
            tr = min(c, nb / bytes_per_us) if nb > 0 else 0.0
            transfer[v] = tr
            rate_alone[v] = nb / tr if tr > 0 else 0.0
            cost[v] = c
            gone[v] = _EPS * max(1.0, c)  # what is left of an op that has finished
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
                    if left[w] == 0:
                        if w in views:  # a view is done when its input is
                            p = ps[w]
                            last = p[0] if len(p) == 1 else max(p, key=finish.__getitem__, default=None)
                            finish[w] = finish[last] if last is not None else 0.0
                            real[w] = real[last] if last is not None else None
                            stack.append(w)
                        else:
                            check.add(stream_of[w])

        for v in roots:
            if v not in finish:
                done(v, 0.0, None)
        t = 0.0
        while True:
            if check:
                for s_ in list(check):
                    q = queue[s_]
                    if pos[s_] < len(q):
                        v = q[pos[s_]]
                        if v not in running and v not in waiting and left[v] == 0:
                            start = free[s_]
                            for u in ps[v]:
                                x = finish[u] + (event_us if real[u] not in (None, s_) else 0.0)
                                if x > start:
                                    start = x
                            waiting[v] = start
                check.clear()
            if waiting:
                for v, start in list(waiting.items()):
                    if start <= t + _EPS:
                        del waiting[v]
                        running[v] = cost[v]
            if not running:
                if not waiting:
                    break
                t = min(waiting.values())
                continue
            # ops in their transfer part share the bandwidth; the others run at their own pace
            share = 1.0
            if len(running) == 1:  # alone: the bandwidth is all its own
                for v, r in running.items():
                    moving = r <= transfer[v] + _EPS
                    if moving:
                        asked = rate_alone[v]
                        if asked > 0:
                            share = min(1.0, max(bytes_per_us, asked) / asked)
                        dt = r / share
                        moving = (v,)
                    else:
                        dt = r - transfer[v]
                        moving = ()
            else:
                moving = [v for v, r in running.items() if r <= transfer[v] + _EPS]
                if moving:
                    asked = sum(rate_alone[v] for v in moving)
                    if asked > 0:
                        share = min(1.0, max([bytes_per_us] + [rate_alone[v] for v in moving]) / asked)
                dt = None
                for v, r in running.items():
                    x = r / share if moving and v in moving else r - transfer[v]
                    if dt is None or x < dt:
                        dt = x
            if waiting:
                x = min(waiting.values()) - t
                if x < dt:
                    dt = x
            if 0.0 > dt:
                dt = 0.0
            t += dt
            for v in list(running):
                r = running[v] - (dt * share if moving and v in moving else dt)
                if r <= gone[v]:
                    del running[v]
                    s_ = stream_of[v]
                    free[s_] = t
                    pos[s_] += 1
                    check.add(s_)
                    done(v, t, s_)
                else:
                    running[v] = r
        return exit_span(order, ps, real, finish, event_us), finish
    return run


def exit_span(order: list, preds: dict, real: dict, finish: dict, event_us: float) -> float:
    """Makespan of a simulated schedule, the join back to the caller's stream included: one
    event at the exit when some side stream's last op has not been waited for by an op on main
    (side work whose results main already consumed was charged at that op's wait)."""
    main_end = 0.0
    side_end: dict = {}
    covered: dict = {}  # side stream -> the latest of its finishes an op on main waited for
    for v in order:
        s = real.get(v)
        if v not in finish or s is None:
            continue
        if s == "main":
            main_end = max(main_end, finish[v])
            for u in preds[v]:
                su = real.get(u)
                if su not in (None, "main") and u in finish:
                    covered[su] = max(covered.get(su, 0.0), finish[u])
        else:
            side_end[s] = max(side_end.get(s, 0.0), finish[v])
    span = max([main_end, *side_end.values()])
    if any(covered.get(s, -1.0) < end for s, end in side_end.items()):
        span += event_us
    return span
