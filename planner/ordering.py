"""Order over a schedule: which ops are views, what a read really depends on, which op
is last on its stream, and happens-before through streams and events.

Shared by derive-events (which places the events) and verify (which proves them).
"""

from __future__ import annotations

from .graph import Compiled
from .ops import VIEW_OPS

__all__ = ["ENTRY", "is_view", "real_preds", "implied", "possible_lasts", "joined_at_exit", "happens_before"]

ENTRY = "entry"


def is_view(g, v) -> bool:
    return g.nodes[v]["op"].op in VIEW_OPS


def real_preds(g, v, memo: dict) -> set:
    """Producers of v's inputs with GPU work, looking through views. 'entry' stands for plan inputs."""
    out = set()
    for name in g.nodes[v]["op"].inputs():
        out |= _source(g, name, memo)
    return out


def _source(g, tensor_name, memo) -> set:
    key = ("t", tensor_name)
    if key in memo:
        return memo[key]
    t = memo["_tensors"].get(tensor_name)
    prod = t.producer if t is not None else None
    if prod is None:
        res = {ENTRY}
    elif is_view(g, prod):
        res = set()
        for n in g.nodes[prod]["op"].inputs():
            res |= _source(g, n, memo)
    else:
        res = {prod}
    memo[key] = res
    return res


def implied(producer_ctx: tuple, consumer_ctx: tuple) -> bool:
    """Whenever the consumer runs, the producer ran (its guards are a subset)."""
    return set(producer_ctx) <= set(consumer_ctx)


def possible_lasts(g, ops_on_stream: list[str]) -> list[str]:
    """Ops that are the last on their stream for some choice of variants."""
    out: list[str] = []
    for v in reversed(ops_on_stream):
        ctx = g.nodes[v]["ctx"]
        if any(implied(g.nodes[w]["ctx"], ctx) for w in out):
            continue  # a later op runs whenever this one does
        out.append(v)
        if not ctx:
            break
    return list(reversed(out))


def joined_at_exit(cp: Compiled) -> list[str]:
    """Ops on side streams that the caller's stream does not know complete at return."""
    g = cp.graph
    pos, counters = {}, {}
    for v in cp.schedule:
        if not is_view(g, v):
            s = g.nodes[v]["stream"]
            counters[s] = counters.get(s, 0) + 1
            pos[v] = counters[s]
    covered: dict = {}  # (stream, ctx) -> latest recording position main waited on
    waited = [e for v in cp.schedule if g.nodes[v]["stream"] == "main" for e in g.nodes[v]["waits"]]
    for e in waited + list(cp.exit_waits):
        r = cp.events.get(e, {}).get("op")
        if r:
            key = (g.nodes[r]["stream"], g.nodes[r]["ctx"])
            covered[key] = max(covered.get(key, 0), pos[r])
    missing = []
    for u, p in pos.items():
        s, ctx = g.nodes[u]["stream"], g.nodes[u]["ctx"]
        if s == "main":
            continue
        if not any(covered.get((s, c), 0) >= p for c in {(), ctx} | {k[1] for k in covered
                                                                   if k[0] == s and implied(k[1], ctx)}):
            missing.append(u)
    return missing


def happens_before(cp: Compiled):
    """hb(u, v): u's work is ordered before v's on the GPU, for any variant choice where both run."""
    g = cp.graph
    memo: dict = {"_tensors": cp.tensors}
    stream_pos = {}
    counters: dict[str, int] = {}
    for v in cp.schedule:
        if is_view(g, v):
            continue
        s = g.nodes[v]["stream"]
        counters[s] = counters.get(s, 0) + 1
        stream_pos[v] = counters[s]
    rec = {e: info["op"] for e, info in cp.events.items()}
    cache: dict = {}

    def hb(u, v):
        srcs = {u} if not is_view(g, u) else real_preds(g, u, memo)
        dsts = [v] if not is_view(g, v) else [w for w in g.successors(v)]
        return all(_hb(a, b) for a in srcs if a != ENTRY for b in dsts if not is_view(g, b)) if dsts else True

    def _hb(a, b):
        key = (a, b)
        if key in cache:
            return cache[key]
        sa, sb = g.nodes[a]["stream"], g.nodes[b]["stream"]
        ok = False
        if sa == sb:
            ok = stream_pos[a] < stream_pos[b]
        else:
            # some earlier-or-equal op on b's stream (or b itself) waited on an event recorded at/after a
            for w in [x for x in cp.schedule if not is_view(g, x) and g.nodes[x]["stream"] == sb
                      and stream_pos[x] <= stream_pos[b]]:
                for e in g.nodes[w]["waits"]:
                    r = rec.get(e)
                    if r is None:
                        continue
                    if r == a or (g.nodes[r]["stream"] == sa and stream_pos[r] >= stream_pos[a]) or _hb(a, r):
                        both = tuple(set(g.nodes[a]["ctx"]) | set(g.nodes[b]["ctx"]))
                        if implied(g.nodes[r]["ctx"], both) or r == a:
                            ok = True
                            break
                if ok:
                    break
        cache[key] = ok
        return ok
    return hb
