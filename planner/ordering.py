"""Order over a schedule: which ops are views, what a read really depends on, and
happens-before through streams and events, sound for every choice of variants.

Shared by derive-events (which places the events) and verify (which proves them).

The model. Positions count the non-view ops of each stream in issue order. An op
runs in a call when every (region, variant) guard of its ctx was chosen; skipped
ops record nothing, and a wait on an event that was not recorded in this call is
skipped by the executor. So knowledge is always relative to a guard set C: the
vector clock of op b under C says, for each stream t, up to which position every
op of t that runs is known complete when b starts, using only waits made by ops
that run under C on events recorded by ops that run under C. hb(a, b) holds when
b's clock under ctx(a) | ctx(b) covers a: then b is ordered after a in every
call where both run.
"""

from __future__ import annotations

from bisect import bisect_left

from .graph import Compiled
from .ops import VIEW_OPS

__all__ = ["ENTRY", "is_view", "real_preds", "implied", "stream_positions", "Order", "ExitCover",
           "joined_at_exit", "happens_before"]

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


def implied(producer_ctx, consumer_ctx) -> bool:
    """Whenever the consumer runs, the producer ran (its guards are a subset)."""
    return set(producer_ctx) <= set(consumer_ctx)


def compatible(a, b) -> bool:
    """Two guard sets can hold in one call (no region picks two variants)."""
    da = dict(a)
    return all(da.get(r, v) == v for r, v in b)


def stream_positions(g, schedule) -> dict[str, int]:
    """1-based position of every non-view op on its stream, in issue order."""
    pos, counters = {}, {}
    for v in schedule:
        if not is_view(g, v):
            s = g.nodes[v]["stream"]
            counters[s] = counters.get(s, 0) + 1
            pos[v] = counters[s]
    return pos


class Order:
    """Vector clocks of a scheduled plan with its waits and records, per guard set.

    The clocks under C = () are computed once over the whole schedule; the clocks under a
    non-empty C only from the first op guarded by a non-empty subset of C on, since before
    it the two agree exactly. Plans whose regions are local therefore stay linear.
    """

    def __init__(self, cp: Compiled):
        g = self.g = cp.graph
        nodes = dict(g.nodes(data=True))
        self.schedule = [v for v in cp.schedule if nodes[v]["op"].op not in VIEW_OPS]
        self.index = {v: i for i, v in enumerate(self.schedule)}
        self.stream = {v: nodes[v]["stream"] for v in self.schedule}
        self.pos, counters = {}, {}
        for v in self.schedule:
            s = self.stream[v]
            counters[s] = counters.get(s, 0) + 1
            self.pos[v] = counters[s]
        self.ctx = {v: frozenset(nodes[v]["ctx"]) for v in self.schedule}
        rec = {e: info.get("op") for e, info in cp.events.items()}
        # recorders waited on; ENTRY is the call's start on main, recorded before any op
        self.waits = {v: [ENTRY if e == ENTRY else rec[e] for e in nodes[v]["waits"] if e == ENTRY or rec.get(e)]
                      for v in self.schedule}
        self._first: dict = {}       # non-empty guard set -> schedule index of its first op
        for i, v in enumerate(self.schedule):
            if self.ctx[v]:
                self._first.setdefault(self.ctx[v], i)
        # unguarded ops per stream (schedule index, op), for the state just before an index
        self._plain: dict[str, list] = {}
        for i, v in enumerate(self.schedule):
            if not self.ctx[v]:
                self._plain.setdefault(self.stream[v], []).append((i, v))
        self._scans: dict = {}
        self._base = self._scan(frozenset())
        self._base.advance(len(self.schedule))

    def _scan(self, c: frozenset) -> _Scan:
        sc = self._scans.get(c)
        if sc is None:
            starts = [i for k, i in self._first.items() if k <= c]
            start = min(starts) if c and starts else (0 if not c else len(self.schedule))
            sc = self._scans[c] = _Scan(self, c, start)
        return sc

    def clock(self, v: str, c=()) -> dict:
        """What v's stream knows complete when v starts, in every call where `c` and v's guards hold."""
        c = frozenset(c) | self.ctx[v]
        if not c:
            return self._base.at[v]
        sc = self._scan(c)
        i = self.index[v]
        if i < sc.start:
            return self._base.at[v]
        sc.advance(i + 1)
        return sc.at[v]

    def after(self, r: str, c: frozenset) -> dict:
        """Clock just after r under c (r runs under c)."""
        base = self.clock(r, c)
        out = dict(base)
        out[self.stream[r]] = self.pos[r]
        return out

    def base_state(self, stream: str, index: int) -> dict:
        """The clock after the last unguarded op of `stream` before schedule index `index`."""
        lst = self._plain.get(stream, [])
        k = bisect_left(lst, (index, "")) - 1
        if k < 0:
            return {}
        v = lst[k][1]
        return self.after(v, frozenset())

    def hb(self, a: str, b: str) -> bool:
        """a (non-view, or ENTRY: the plan inputs) is complete before b (non-view) starts in
        every call where both run."""
        if a == ENTRY:
            return self.clock(b).get(ENTRY, 0) >= 1
        ca, cb = self.ctx[a], self.ctx[b]
        if not compatible(ca, cb):
            return True  # never in one call
        if self.stream[a] == self.stream[b]:
            return self.pos[a] < self.pos[b]
        return self.clock(b, ca).get(self.stream[a], 0) >= self.pos[a]

    def final_main(self) -> dict:
        """What the caller's stream knows complete after its last unguarded op."""
        return self.base_state("main", len(self.schedule))


class _Scan:
    """Clocks under one guard set, computed in issue order on demand."""

    def __init__(self, order: Order, c: frozenset, start: int):
        self.o, self.c, self.start, self.done = order, c, start, start
        self.at: dict[str, dict] = {}
        self.state: dict[str, dict] = {}   # stream -> clock after its last op run under c

    def advance(self, upto: int) -> None:
        o, c = self.o, self.c
        for i in range(self.done, upto):
            w = o.schedule[i]
            if not o.ctx[w] <= c:
                continue
            s = o.stream[w]
            cur = self.state.get(s)
            if cur is None:
                cur = o.base_state(s, self.start) if self.start > 0 and c else {}
                if s == "main":
                    cur = {**cur, ENTRY: 1}  # the caller wrote the inputs on main before the call
            clk = dict(cur)
            for r in o.waits[w]:
                if r == ENTRY:
                    clk[ENTRY] = 1
                elif o.ctx[r] <= c and o.index[r] < i:
                    src = self.at[r] if o.index[r] >= self.start else o.clock(r, c)
                    for t, p in src.items():
                        if p > clk.get(t, 0):
                            clk[t] = p
                    if o.pos[r] > clk.get(o.stream[r], 0):
                        clk[o.stream[r]] = o.pos[r]
            self.at[w] = clk
            nxt = dict(clk)
            nxt[s] = o.pos[w]
            self.state[s] = nxt
        self.done = max(self.done, upto)


class ExitCover:
    """Which side-stream ops the caller's stream knows complete when the call returns.

    An op u on side stream t is joined when, in every call where u runs, main has waited
    (in an op of its own or at exit) on an event recorded at or after u on t: the waiter
    and the recorder must both run whenever u does. Knowledge main holds unconditionally
    (its clock after its last unguarded op) counts too.
    """

    def __init__(self, cp: Compiled, order: Order):
        self.o = order
        self.final = order.final_main()
        self.best: dict[str, dict] = {}   # stream -> {guard set: highest covered position}
        for w in order.schedule:
            if order.stream[w] == "main":
                for r in order.waits[w]:
                    if r != ENTRY:
                        self._add(r, order.ctx[w])
        rec = {e: info.get("op") for e, info in cp.events.items()}
        for e in cp.exit_waits:
            if rec.get(e):
                self._add(rec[e], frozenset())

    def _add(self, r: str, waiter_ctx: frozenset) -> None:
        o = self.o
        t = o.stream[r]
        if t == "main":
            return
        key = o.ctx[r] | waiter_ctx
        d = self.best.setdefault(t, {})
        if o.pos[r] > d.get(key, 0):
            d[key] = o.pos[r]

    def add_exit(self, r: str) -> None:
        self._add(r, frozenset())

    def covers(self, u: str) -> bool:
        o = self.o
        t, p, cu = o.stream[u], o.pos[u], o.ctx[u]
        if self.final.get(t, 0) >= p:
            return True
        return any(q >= p and k <= cu for k, q in self.best.get(t, {}).items())


def joined_at_exit(cp: Compiled, order: Order | None = None) -> list[str]:
    """Ops on side streams that the caller's stream may not know complete at return."""
    order = order or Order(cp)
    cover = ExitCover(cp, order)
    return [u for u in order.schedule if order.stream[u] != "main" and not cover.covers(u)]


def happens_before(cp: Compiled, order: Order | None = None):
    """hb(u, v): u's work is ordered before v's on the GPU, for any variant choice where both run.

    Views do no work: a view as source stands for the producers it looks through, a view
    as destination for the ops that read it.
    """
    g = cp.graph
    order = order or Order(cp)
    memo: dict = {"_tensors": cp.tensors}

    def dests(v):
        if v in order.index:
            return [v]
        out = []
        for w in g.successors(v):
            out += dests(w)
        return out

    def hb(u, v):
        srcs = {u} if u in order.index else real_preds(g, u, memo)
        return all(order.hb(a, b) for a in srcs for b in dests(v))
    return hb
