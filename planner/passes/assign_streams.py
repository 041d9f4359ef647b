"""assign-streams: put independent work on a small pool of streams, where it pays at every size.

Pre: fusion done. Post: every op has `stream` in cp.streams; cp.report[NAME] says, per
scope, what was decided and the scheduled estimate it rests on.

Streams are declared: the plan's `streams:` list (main first), or main plus the
planner's pool (main + num_streams-1 aux streams shared by every layer: never a stream
per layer), as many as the plan pins (aux3: four streams) and at least two. `--streams N`
bounds all of them: pins to a stream beyond the first N are folded onto main, the report
lists each fold with its location, and the CLI warns of it.

Pins constrain, they do not disable: a pinned op is fixed, and the rest of its scope is
still planned and checked. Collectives stay on main unless pinned (one communicator is
driven from one stream, in one order on every rank); externs that declare
`side_stream: false` stay on main; every other op, model code included, may move.
Views follow their input.

One consistent decision: every candidate assignment is rated with analysis.simulate
over the issue order the schedule pass will use (plan order among ready ops), at every
bucket the scope can see (its gates' dims), with overlapped ops sharing the HBM bandwidth
(planner/sharing.py; --free-overlap rates overlap as free). Candidates: serial, a list schedule per
representative bucket, and a local search from each. A candidate is admissible only if
its scheduled time is no worse than serial at every bucket and it saves min_gain_us at
some bucket; of those, the one with the smallest worst-case loss against the best
candidate at each bucket wins. If none is admissible the scope stays serial and the
report says why. A final check simulates each plan variant as a whole and returns
scopes to serial while any bucket is rated slower than serial. This pass only
annotates: derive-events turns the annotations into records and waits.
"""

from __future__ import annotations

import heapq

from ..analysis import (
    allowed_buckets,
    graph_shape,
    issue_order,
    per_op,
    possible_buckets,
    running_variants,
    simulator,
    variant_picks,
)
from ..cost import CostModel
from ..graph import Compiled, compatible
from ..ops import COLLECTIVES, VIEW_OPS
from .bucket_plans import bucket_ranges

NAME = "assign-streams"
SEARCH_MAX_OPS = 48       # local search only in scopes this small (per move: one simulate per bucket)
SEARCH_BUCKETS = 5        # buckets rated during the search; every bucket rates the finalists
NEIGHBOR_MAX_OPS = 16     # scopes this small also rate every single / chain move from serial
LARGE_SCOPE = 2000        # above this many ops, rate the largest bucket only (compile time)
BUCKET_PLAN_GAIN = 0.01   # a bucket gets its own assignment where it beats the single choice by 1 %


def plan_streams(cp: Compiled) -> int:
    """How many streams a plan asks for when no bound is given: its `streams:` list, or main + aux
    and every pool stream aux<N> its live ops pin (a pin to aux3 asks for main, aux1, aux2, aux3;
    a pin in a variant dce removed asks for nothing)."""
    if cp.plan.streams:
        return len(cp.plan.streams)
    pins = (d["op"].stream for _, d in cp.graph.nodes(data=True))
    pinned = [int(s[3:]) for s in pins if s and s[3:].isdigit()]
    return max(2, 1 + max(pinned, default=1))


def pool(n: int) -> list[str]:
    return ["main"] + (["aux"] if n == 2 else [f"aux{i}" for i in range(1, n)])


# the first aux stream of the pool is "aux" with two streams and "aux1" with more: a pin written
# for one pool size means the same stream at another
_POOL_ALIAS = {"aux": "aux1", "aux1": "aux"}


def stays_on_main(op) -> bool:
    return op.op in COLLECTIVES or (op.op == "extern" and (not op.side_stream or op.effects))


def stream_pool(cp: Compiled, num_streams: int | None) -> list[str]:
    """The streams a compile with this --streams bound (None: the plan's own) runs on."""
    n = plan_streams(cp) if num_streams is None else max(1, num_streams)
    return list(cp.plan.streams[:n]) if cp.plan.streams else pool(n)


def landing(plan, s: str, streams: list[str]) -> str:
    """The pool stream a pin to `s` runs on: itself, its pool alias (aux / aux1), else main (folded)."""
    if not plan.streams and s not in streams:
        s = _POOL_ALIAS.get(s, s)
    return s if s in streams else "main"


def pin_target(plan, op, streams: list[str]) -> str | None:
    """The stream op's pin lands on in this pool, so fusion passes can tell whether two ops may
    become one without moving either: None where the planner places the op; "main" for an
    unpinned op that stays there anyway (and for a pin the bound folds onto main)."""
    if not op.stream:
        return "main" if stays_on_main(op) else None
    return landing(plan, op.stream, streams)


def pin_text(s: str | None) -> str:
    return f"pinned to {s}" if s else "unpinned"


def run(cp: Compiled, cfg) -> tuple[Compiled, bool]:
    g = cp.graph
    streams = stream_pool(cp, cfg.num_streams)
    n = len(streams) if cfg.num_streams is None else max(1, cfg.num_streams)
    pinned, folded, folded_ids = {}, [], set()
    for v, d in g.nodes(data=True):
        written = d["op"].stream
        if not written:
            continue
        pinned[v] = s = landing(cp.plan, written, streams)
        if s == "main" and written != "main":
            folded_ids.add(v)
            loc = _pin_loc(cp, v)
            folded.append({"text": f"{v} pinned to {written} -> main (--streams {n} allows {', '.join(streams)})",
                           "loc": str(loc) if loc else ""})
    cp.streams = streams
    model = CostModel(cfg.profile, cp.plan.groups)
    tuned = {**cp.plan.tuned, **cfg.tuned}
    ev = cfg.profile.event_us
    order = issue_order(cp)
    cost = per_op(cp, model.op_us)
    bw = cfg.profile.hbm_gbps * 1e3 if cfg.share_bandwidth else 0.0  # bytes per us
    moved = per_op(cp, model.op_demand) if bw > 0 else None
    scopes: dict[tuple, list[str]] = {}
    for v in order:
        scopes.setdefault(g.nodes[v]["ctx"], []).append(v)
    assign: dict[str, str] = {}
    decisions: dict[tuple, dict] = {}
    planned: dict[tuple, tuple] = {}  # scope signature -> (its nodes, assignment, decision)
    # regions first: the always-running scope is then planned beside their decided streams
    for ctx, own in sorted(scopes.items(), key=lambda kv: not kv[0]):
        buckets = allowed_buckets(cp, ctx, tuned)
        if len(own) > LARGE_SCOPE:
            buckets = buckets[-1:]  # compile time: the largest size only
        nodes, scope_pins = own, pinned
        if not ctx:  # ops outside regions may overlap the regions' work: rate them beside it
            nodes, scope_pins = _with_regions(cp, order, scopes, own, pinned, assign)
        costs = [cost(nodes, b) for b in buckets]
        demand = [moved(nodes, b) for b in buckets] if moved else None
        if nodes is not own:
            _idle_variants_free(cp, set(own), nodes, buckets, costs, demand, tuned)
        sig = _signature(g, nodes, buckets, costs, demand, scope_pins)
        if sig in planned:  # a repeated layer: the same decision, position by position
            first, a0, info0 = planned[sig]
            pos = dict(zip(first, nodes, strict=True))
            a = {pos[u]: s for u, s in a0.items()}
            info = {**info0}
            if "bucket_alts" in info:
                info["bucket_alts"] = {i: ({pos[u]: s for u, s in alt.items()}, us)
                                       for i, (alt, us) in info["bucket_alts"].items()}
        else:
            a, info = _plan_scope(cp, nodes, costs, buckets, streams, scope_pins, ev, cfg.min_gain_us, demand, bw)
            planned[sig] = (nodes, a, info)
        if nodes is not own:
            a, info = _own_part(cp, own, a, info, pinned)
        assign.update({v: a[v] for v in own})
        decisions[ctx] = info
    decisions = {c: decisions[c] for c in scopes}  # the report lists scopes in plan order
    for c, info in decisions.items():  # a folded pin is not kept where it was pinned
        info["pinned"] -= sum(1 for v in scopes[c] if v in folded_ids)
    _check_variants(cp, order, assign, decisions, scopes, cost, tuned, ev, pinned, moved, bw)
    cp.bucket_ranges = bucket_ranges(cp, decisions, scopes)  # plan-buckets makes them plans
    changed = False
    for v in g.nodes:
        if g.nodes[v]["stream"] != assign[v]:
            g.nodes[v]["stream"] = assign[v]
            changed = True
    grouped: dict[str, list[str]] = {}
    for ctx, info in decisions.items():
        label = " / ".join(f"{r}:{v}" for r, v in ctx) or "(always)"
        grouped.setdefault(_text(info), []).append(label)
    cp.report[NAME] = [{"scopes": labels, "decision": msg} for msg, labels in grouped.items()]
    cp.report[NAME + ":scopes"] = [{"scope": [list(x) for x in ctx], **{k: v for k, v in info.items() if k != "text"}}
                                   for ctx, info in decisions.items()]
    cp.report[NAME + ":measured_used"] = len(model.hits)  # tuning times the planner looked up
    if folded:
        cp.report[NAME].append({"scopes": ["(pins)"], "decision": "pins folded: " + "; ".join(
            f["text"] + (f" at {f['loc']}" if f["loc"] else "") for f in folded)})
    cp.report[NAME + ":folded"] = folded
    return cp, changed


def _pin_loc(cp: Compiled, v: str):
    """Where v's pin was written: a fused op's pin is its members' (fused_from; the all_reduce of
    a fused all_reduce + norm comes first), not where the fused op's name was written."""
    locs = cp.plan.locs
    members = getattr(cp.graph.nodes[v]["op"], "fused_from", None) or []
    return next((locs[m] for m in members if m in locs), None) or locs.get(v)


def _with_regions(cp, order, scopes, nodes, pinned, decided):
    """The always-running scope's ops together with every region's ops, the latter fixed on the
    streams their own scopes chose (`decided`), so independent work outside a region can go
    beside a long region (routed experts in a gated MoE block): (nodes, pins). Unchanged when the
    plan has no regions or too many region ops to rate (repeated layers)."""
    region_ops = [v for c, vs in scopes.items() if c for v in vs]
    if not region_ops or len(nodes) + len(region_ops) > SEARCH_MAX_OPS * 4:
        return nodes, pinned
    keep = set(nodes) | set(region_ops)
    ext = [v for v in order if v in keep]
    return ext, {**pinned, **{v: decided.get(v, pinned.get(v, "main")) for v in region_ops}}


def _idle_variants_free(cp, own: set, nodes, buckets, costs, demand, tuned):
    """In place: a region op (in nodes, not in own) costs nothing at a bucket where another
    variant of its region takes the call."""
    g = cp.graph
    for i, b in enumerate(buckets):
        runs = running_variants(cp, b, tuned)
        for v in nodes:
            if v not in own and any(runs.get(r) != name for r, name in g.nodes[v]["ctx"]):
                costs[i][v] = 0.0
                if demand:
                    demand[i][v] = 0.0


def _own_part(cp, own, a, info, pinned):
    """The assignment and the decision of a scope planned beside the regions' ops, restricted to
    the scope's own ops: a region's selects (views of every variant's result) stay on main, where
    a plan of the scope alone puts them; moved / used / pinned count the scope's own ops."""
    g = cp.graph
    inside = set(own)
    a = dict(a)
    for v in own:
        d = g.nodes[v]
        if d["op"].op in VIEW_OPS and not d["op"].stream and not any(u in inside for u in g.predecessors(v)):
            a[v] = "main"
    real = [v for v in own if g.nodes[v]["op"].op not in VIEW_OPS]
    info = {**info, "pinned": sum(1 for v in own if v in pinned),
            "moved": sum(1 for v in real if a[v] != "main"),
            "used": sorted({a[v] for v in real if a[v] != "main"})}
    if info["mode"] == "pinned" and not any(pinned.get(v, "main") != "main" for v in own):
        info["mode"] = "serial"  # only the regions' own choices were off main
        info["beside_regions"] = True
    return a, info


def _signature(g, nodes, buckets, costs, demand, pinned) -> tuple:
    """Everything _plan_scope reads of a scope, by position: two scopes with equal signatures
    (the layers of a repeated block) get the same decision."""
    index = {v: i for i, v in enumerate(nodes)}
    rows = []
    for v in nodes:
        op = g.nodes[v]["op"]
        rows.append((op.op, op.op == "extern" and stays_on_main(op), pinned.get(v),
                     tuple(index[u] for u in g.predecessors(v) if u in index),
                     tuple(c[v] for c in costs), tuple(d[v] for d in demand) if demand else None))
    return tuple(tuple(sorted(b.items())) for b in buckets), tuple(rows)


# ---------------------------------------------------------------- one scope

def _plan_scope(cp, nodes, costs, buckets, streams, pinned, ev, min_gain, demand=None, bw=0.0):
    g = cp.graph
    movable = [v for v in nodes if v not in pinned and g.nodes[v]["op"].op not in VIEW_OPS
               and not stays_on_main(g.nodes[v]["op"])]
    serial_a = _views_follow(cp, nodes, {v: pinned.get(v, "main") for v in nodes})
    serial = [sum(c.values()) for c in costs]  # everything on the caller's stream, one after another

    shape = graph_shape(cp, nodes)
    # buckets whose costs and bytes equal an earlier one's (small sizes often do) rate alike
    same = list(range(len(buckets)))
    for i in range(1, len(buckets)):
        for j in range(i):
            if same[j] == j and costs[j] == costs[i] and (not demand or demand[j] == demand[i]):
                same[i] = j
                break

    def rate(a, which=None):
        idx = range(len(buckets)) if which is None else which
        if not _moved(a):  # all on main: the simulation is the sum
            return [serial[i] for i in idx]
        sim = simulator(cp, nodes, ev, a, shape, bw)
        spans: dict[int, float] = {}
        for i in idx:
            if same[i] not in spans:
                spans[same[i]] = sim(costs[same[i]], demand[same[i]] if demand else None)[0]
        return [spans[same[i]] for i in idx]

    cands = {_key(serial_a): serial_a}
    if len(streams) > 1 and movable:
        reps = _spread_idx(len(buckets), 3) if len(nodes) <= LARGE_SCOPE else [len(buckets) - 1]
        for i in sorted(set(reps)):
            a = _views_follow(cp, nodes, _list_schedule(cp, nodes, costs[i], streams, pinned, ev))
            cands.setdefault(_key(a), a)
        if len(movable) <= SEARCH_MAX_OPS:
            probe = _spread_idx(len(buckets), SEARCH_BUCKETS)
            for start in list(cands.values()):
                a = _local_search(cp, nodes, movable, start, streams, [serial[i] for i in probe],
                                  lambda x: rate(x, probe))
                cands.setdefault(_key(a), a)
        if len(movable) <= NEIGHBOR_MAX_OPS and any(_moved(a) for a in cands.values()):
            # where the searches found any overlap, every single move and chain move from serial is a
            # candidate of its own: the greedy search optimizes the worst ratio to serial and can
            # settle on a small uniform gain (a 1-op move) where moving one branch gains far more
            for group in [[v] for v in movable] + _chains(cp, nodes, movable):
                for st in streams[1:]:
                    a = _views_follow(cp, nodes, {**serial_a, **{v: st for v in group}})
                    cands.setdefault(_key(a), a)
    rated = {k: rate(a) for k, a in cands.items()}
    best = [min(r[i] for r in rated.values()) for i in range(len(buckets))]
    pins_only = _key(serial_a)

    def worst_loss(k):
        return max(r - b for r, b in zip(rated[k], best, strict=True))

    ok = [k for k in cands if k != pins_only
          and all(r <= s + 1e-9 for r, s in zip(rated[k], serial, strict=True))
          and max(s - r for r, s in zip(rated[k], serial, strict=True)) >= min_gain]
    info = {"buckets": buckets, "serial_us": [round(s, 2) for s in serial], "streams": len(streams)}
    # the pins (or the regions' decided streams) alone compete too: a move on top of them must
    # beat what they already overlap
    pool = ok + ([pins_only] if ok and _moved(serial_a) else [])
    if pool:
        k = min(pool, key=lambda k: (round(worst_loss(k), 6), sum(rated[k]), _moved(cands[k])))
        chosen, why = cands[k], ("chosen" if k != pins_only else "pinned")
    else:
        k, chosen = pins_only, serial_a
        why = "pinned" if _moved(serial_a) else "serial"
    sched = rated[k]
    # does the best decision differ across buckets? (then the choice is the smallest worst-case loss,
    # and where another candidate beats it by enough at a bucket, that bucket gets its own: bucket_plans)
    best_at = [min(rated, key=lambda kk: (rated[kk][i], _moved(cands[kk]))) for i in range(len(buckets))]
    winners = set(best_at)
    alts = {}
    for i, w in enumerate(best_at):
        if w == k or rated[w][i] > serial[i] + 1e-9:
            continue
        # another plan for this bucket must beat the single choice by 1 % and by more than two
        # events (no mirror images of it), and a fork must save min_gain against serial there
        better = rated[k][i] - rated[w][i] > max(BUCKET_PLAN_GAIN * rated[k][i], 2 * ev, 1e-6)
        worth = w == pins_only or serial[i] - rated[w][i] >= min_gain
        if better and worth:
            alts[i] = (cands[w], round(rated[w][i], 2))
    moved = sum(1 for v in nodes if chosen[v] != "main" and g.nodes[v]["op"].op not in VIEW_OPS)
    info.update(scheduled_us=[round(s, 2) for s in sched], mode=why, moved=moved,
                used=sorted({s for s in chosen.values() if s != "main"}),
                pinned=sum(1 for v in nodes if v in pinned),
                differs=len(winners) > 1 and worst_loss(k) >= 0.05, worst_loss_us=round(worst_loss(k), 2),
                best_multi=_best_multi(rated, cands, pins_only, serial, buckets))
    if alts:
        info["bucket_alts"] = alts  # {bucket index: (assignment, scheduled us)}; taken out of the report
    return chosen, info


def _best_multi(rated, cands, pins_only, serial, buckets):
    """The best rejected multi-stream candidate (for the report's 'why not')."""
    others = [k for k in cands if k != pins_only and _moved(cands[k])]
    if not others:
        return None
    k = min(others, key=lambda k: max(r - s for r, s in zip(rated[k], serial, strict=True)))
    worst = max(range(len(buckets)), key=lambda i: rated[k][i] - serial[i])
    best = max(range(len(buckets)), key=lambda i: serial[i] - rated[k][i])
    return {"worst_at": buckets[worst], "worst_us": round(rated[k][worst], 2), "worst_serial_us": round(serial[worst], 2),
            "best_gain_us": round(serial[best] - rated[k][best], 2)}


def _moved(a: dict) -> int:
    return sum(1 for s in a.values() if s != "main")


def _key(a: dict) -> tuple:
    return tuple(sorted(a.items()))


def _spread_idx(n: int, k: int) -> list[int]:
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _views_follow(cp, nodes, a: dict) -> dict:
    """Views run where their input's producer runs (they do no work of their own)."""
    g = cp.graph
    out = dict(a)
    for v in nodes:
        d = g.nodes[v]
        if d["op"].op in VIEW_OPS and not d["op"].stream:
            preds = [u for u in g.predecessors(v) if u in out]
            out[v] = out[preds[0]] if preds else "main"
    return out


def _chains(cp, nodes, movable, longest: int = 4) -> list[list[str]]:
    """Each movable op with the ops it alone feeds, one after another (through views), every
    prefix up to `longest` ops: a branch like act -> down-projection gains only when it moves
    as a whole (either op alone adds a cross-stream wait and loses)."""
    g = cp.graph
    inside, mov = set(nodes), set(movable)

    def next_ops(v):
        out = []
        for u in g.successors(v):
            if u not in inside:
                continue
            if g.nodes[u]["op"].op in VIEW_OPS:
                out += [w for w in g.successors(u) if w in inside]
            else:
                out.append(u)
        return list(dict.fromkeys(out))

    chains = []
    for v in movable:
        chain = [v]
        while len(chain) < longest:
            nxt = next_ops(chain[-1])
            if len(nxt) != 1 or nxt[0] not in mov or nxt[0] in chain:
                break
            chain.append(nxt[0])
            chains.append(list(chain))  # every prefix: where the branch rejoins main is open
    return chains


def _local_search(cp, nodes, movable, start, streams, serial, rate):
    """Greedy best-improvement moves of one op, or of a chain of ops (_chains), to another
    stream; objective: worst ratio to serial."""
    def score(a):
        r = rate(a)
        return (max(x / s if s else 1.0 for x, s in zip(r, serial, strict=True)), sum(r))
    moves = [[v] for v in movable] + _chains(cp, nodes, movable)
    cur = start
    cur_s = score(cur)
    for _ in range(2 * len(movable)):
        best = None
        for group in moves:
            for s in streams:
                if all(cur[v] == s for v in group):
                    continue
                a = _views_follow(cp, nodes, {**cur, **{v: s for v in group}})
                sc = score(a)
                if sc < cur_s and (best is None or sc < best[0]):
                    best = (sc, a)
        if best is None or best[0][0] > cur_s[0] - 1e-9 and best[0][1] > cur_s[1] - 1e-6:
            break
        cur_s, cur = best
    return cur


def _list_schedule(cp: Compiled, nodes: list[str], costs: dict, streams: list[str], pinned: dict, ev: float):
    """Highest upward rank first, each op on the stream where it finishes earliest."""
    g = cp.graph
    inside = set(nodes)
    rank: dict[str, float] = {}
    for v in reversed(nodes):
        rank[v] = costs[v] + max((rank[s] for s in g.successors(v) if s in inside), default=0.0)
    indeg = {v: sum(1 for u in g.predecessors(v) if u in inside) for v in nodes}
    pos = {v: i for i, v in enumerate(nodes)}
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
        if op.op in VIEW_OPS and v not in pinned:
            real[v] = preds
            finish[v] = max((finish[u] for u in preds), default=0.0)
            assign[v] = assign[preds[0]] if preds else "main"
        else:
            options = [pinned[v]] if v in pinned else ["main"] if stays_on_main(op) else streams
            best = None
            for s in options:
                start = max(free[s], ev if s != "main" else 0.0)
                for u in preds:
                    start = max(start, finish[u] + (ev if assign[u] != s else 0.0))
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
    return assign


# ---------------------------------------------------------------- whole variants

def _check_variants(cp, issue, assign, decisions, scopes, cost, tuned, ev, pinned, moved=None, bw=0.0):
    """Simulate each plan variant (combination, analysis.variant_picks) as a whole at the
    buckets where it runs; a scope whose overlap loses against serial at some bucket goes back
    to serial (scopes interact on shared streams)."""
    for label, choice, together in variant_picks(cp):  # every combination of variants that can run together
        cc = tuple(sorted(choice.items()))
        ctxs = [c for c in scopes if compatible(cc, c)]
        if len(ctxs) < 2:
            continue  # one scope: its own rating was already of the whole variant
        bks = possible_buckets(cp, cc, tuned, together) if choice else allowed_buckets(cp, (), tuned)
        if not bks:
            continue  # these variants never run (together)
        nodes = {v for c in ctxs for v in scopes[c]}
        order = [v for v in issue if v in nodes]
        shape = graph_shape(cp, order)
        for _ in range(len(ctxs)):
            multi = [c for c in ctxs if decisions[c]["mode"] == "chosen"]
            if not multi:
                break
            bad = None
            sim = simulator(cp, order, ev, assign, shape, bw)
            for b in bks if len(order) <= LARGE_SCOPE else bks[-1:]:
                costs = cost(order, b)
                demand = moved(order, b) if moved else None
                span = sim(costs, demand)[0]
                if span > sum(costs.values()) + 1e-9:
                    bad = (b, span, sum(costs.values()))
                    break
            if bad is None:
                break
            c = max(multi, key=lambda c: len(scopes[c]))
            for v in scopes[c]:
                assign[v] = pinned.get(v, "main")
            assign.update(_views_follow(cp, scopes[c], {v: assign[v] for v in scopes[c]}))
            decisions[c].update(mode="variant", at=bad[0], variant=label,
                                variant_us=round(bad[1], 2), variant_serial_us=round(bad[2], 2),
                                scheduled_us=decisions[c]["serial_us"], moved=0, used=[])


# ---------------------------------------------------------------- report text

def _fmt(b: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in b.items()) or "static shapes"


def _text(info: dict) -> str:
    bk, ser, sch = info["buckets"], info["serial_us"], info["scheduled_us"]
    span = f"{_fmt(bk[0])}" + (f" .. {_fmt(bk[-1])}" if len(bk) > 1 else "")
    pins = f"; {info['pinned']} pinned op(s) kept where pinned" if info["pinned"] else ""
    if info["mode"] == "chosen":
        gains = [s - r for s, r in zip(ser, sch, strict=True)]
        lo, hi = min(range(len(bk)), key=lambda i: gains[i]), max(range(len(bk)), key=lambda i: gains[i])
        how = ""
        if info["differs"]:
            how = (f"; the best assignment differs across buckets: chose the one with the smallest worst-case"
                   f" loss ({info['worst_loss_us']:.1f} us)")
        least = f", {sch[lo]:.1f} vs {ser[lo]:.1f} us at {_fmt(bk[lo])}" if lo != hi else ""
        return (f"{info['moved']} op(s) on {', '.join(info['used'])}: scheduled {sch[hi]:.1f} us vs {ser[hi]:.1f} us"
                f" serial at {_fmt(bk[hi])} (saves {gains[hi]:.1f} us){least}; never slower than serial over"
                f" {span}{how}{pins}")
    if info["mode"] == "pinned":
        worst = max(range(len(bk)), key=lambda i: sch[i] - ser[i])
        slower = " (slower than serial: the pins force it)" if sch[worst] > ser[worst] + 1e-9 else ""
        return (f"as pinned: {info['moved']} pinned op(s) on {', '.join(info['used'])}, nothing else moves with"
                f" profit; scheduled {sch[worst]:.1f} us vs {ser[worst]:.1f} us serial at {_fmt(bk[worst])}{slower}")
    if info["mode"] == "variant":
        return (f"serial: the overlap made variant {info['variant']} {info['variant_us']:.1f} us vs"
                f" {info['variant_serial_us']:.1f} us serial at {_fmt(info['at'])}{pins}")
    if info.get("beside_regions"):
        return ("serial: no op outside the regions moves with profit beside the regions' own streams"
                f" ({sch[-1]:.1f} us at {_fmt(bk[-1])}){pins}")
    bm = info.get("best_multi")
    if bm is None:
        why = "one stream allowed (--streams 1)" if info["streams"] == 1 else "no independent work to overlap"
        return f"single stream: {why} ({ser[-1]:.1f} us at {_fmt(bk[-1])}){pins}"
    if bm["worst_us"] > bm["worst_serial_us"] + 1e-9:
        return (f"serial: the best overlap would be {bm['worst_us']:.1f} us vs {bm['worst_serial_us']:.1f} us"
                f" serial at {_fmt(bm['worst_at'])} (slower than serial at a bucket the scope sees){pins}")
    return (f"serial: the best overlap saves {bm['best_gain_us']:.1f} us at most over {span};"
            f" the fork/join does not pay{pins}")
