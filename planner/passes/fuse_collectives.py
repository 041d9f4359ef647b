"""fuse-collectives: merge independent collectives into packed buckets.

Pre: dce ran. Post: collectives of the same kind, process group, dim, dtype,
reduction (sum and avg never merge), stream pin (the fused collective keeps it) and
variant context with no path between them, whose results no op overwrites in place, within the byte cap,
and whose merge does not delay any member past its slack on the critical path,
are replaced by   pack (cat) -> one collective -> unpack (split into the
original output names). Readers are unchanged. Every rank compiles the same
plan deterministically, so every rank issues the same collectives in the same
order. Slack counts the comm order: collectives that land on one stream run one
after another, so a member that starts only when an earlier one ends is not
delayed by waiting for it; a delay within 1 % of the members' time (at least
0.01 us) is a tie, not a delay.

Zero-copy packing: a member whose producer can write into a strided slot
(gemm, add, copy) gets `out_slot` and is not copied by the pack; members made by
opaque code or given as plan inputs are copied. The report says which and why.

Unpacked results are views of the packed result, strided unless packed along dim 0.
A result some reader cannot take as such a view (a view op needs it contiguous, a
gate asks contiguous() of it, an in-place norm needs a buffer of its own; found
through slices, splits and selects, packed_views.py) makes the pass pack along a
dim that keeps it whole where one exists, else copy it out of the packed result
(one small kernel, in the estimate), else, where the cost model says that copy
costs more than the member's own collective, leave the member out (reported).

all_to_all is never fused: packing two exchanges along dim 0 would interleave their
per-peer chunks (peer j must get chunk j of each member, contiguous in its own buffer),
so a packed exchange needs a per-peer re-layout that costs what it saves. The report
lists each all_to_all with that reason.
"""

from __future__ import annotations

import networkx as nx

from ..analysis import allowed_buckets, op_costs, rep_bindings
from ..cost import CostModel
from ..expr import Bin, Num, unparse
from ..graph import Compiled, compatible, rebuild_edges
from ..infer import InferCtx
from ..opbase import written_in_place
from ..ops import COLLECTIVES, PACKABLE_COLLECTIVES, Cat, Copy, Split
from ..shapes import DTYPES, nbytes_at
from .assign_streams import pin_target, pin_text, stream_pool
from .pack_layout import (
    Layout,
    at_text,
    copy_or_leave_out,
    estimate,
    layout,
    operands,
    pack_dim,
)
from .packed_views import Readers

NAME = "fuse-collectives"
FUSABLE = PACKABLE_COLLECTIVES


def _acyclic(g, buckets: list[list[str]]) -> bool:
    """The graph with each bucket's members made one op (the packed collective: it reads every
    member's input, every member's reader reads it) is still a DAG."""
    rep = {v: ms[0] for ms in buckets for v in ms}
    q = nx.DiGraph()
    q.add_nodes_from(rep.get(v, v) for v in g)
    q.add_edges_from((rep.get(u, u), rep.get(v, v)) for u, v in g.edges if rep.get(u, u) != rep.get(v, v))
    return nx.is_directed_acyclic_graph(q)


def _without_cycles(g, kept: list, report: dict) -> list:
    """The buckets (in plan order) that can all be packed: no path joins the members of one
    bucket, but two buckets over different groups can each need the other's results (a1 feeds
    b2 and b1 feeds a2); packing both would be a cycle. The earlier bucket is kept."""
    if len(kept) < 2 or _acyclic(g, [b[0] for b in kept]):
        return kept
    out: list = []
    for b in kept:
        if _acyclic(g, [k[0] for k in out] + [b[0]]):
            out.append(b)
            continue
        other = next((k[0] for k in out if not _acyclic(g, [k[0], b[0]])), None)
        why = (f"packed, they and the packed {' + '.join(other)} would each wait on the other's results (a cycle)"
               if other else "packed, they would close a cycle through the other packed collectives")
        report["not_fused"].append({"ops": b[0][:2], "reason": why})
    return out


def _us(x: float) -> str:
    # two decimals below 1 us: a delay past the tolerance never reads as 0.0
    return f"{x:.1f} us" if round(x, 1) >= 1 else f"{x:.2f} us"


def _key(cp: Compiled, v: str, streams: list[str]):
    d = cp.graph.nodes[v]
    op = d["op"]
    x = cp.tensors[op.x]
    dim = getattr(op, "dim", None)
    if dim is not None:
        dim = dim % x.rank
    # the stream a pin lands on is part of the key: the fused op runs on one stream, so only
    # members whose pins land on the same one can share it without moving either
    return (op.op, op.group, dim, x.dtype, getattr(op, "reduce", None), getattr(op, "backend", "auto"),
            pin_target(cp.plan, op, streams), d["ctx"])


def _why_differs(cp: Compiled, u: str, v: str, k1, k2) -> str:
    names = ["kind", "process group", "dim", "dtype", "reduction", "backend", "stream pin", "variant context"]
    for n, a, b in zip(names, k1, k2, strict=True):
        if a != b:
            if n == "stream pin":
                pu, pv = (pin_text(cp.graph.nodes[w]["op"].stream) for w in (u, v))
                return f"different stream pins ({pu} vs {pv}): the fused op runs on one stream"
            if n != "variant context":
                return f"different {n} ({a} vs {b})"
            if not compatible(a, b):
                return "different variants (exclusive at run time)"
            def label(c):
                return " / ".join(f"{r}:{v}" for r, v in c) or "every call"
            return (f"different variant contexts ({label(a)} vs {label(b)}): they can run in one call,"
                    " but fusion stays within one context")
    return "same key"


def _timing(cp: Compiled, order: list[str], costs: dict, streams: list[str]):
    """(ready, es, late, nxt) per op: when its inputs are ready, its earliest start, the latest
    start its readers allow, and for a collective the (latest start, id) of the next one on its
    stream. Collectives that land on one stream run one after another in issue order, so a
    collective starts no earlier than the end of every earlier one there that can run in the
    same call; the longest path counts those edges too."""
    g = cp.graph
    lane = {v: pin_target(cp.plan, g.nodes[v]["op"], streams) or f"group {g.nodes[v]['op'].group}"
            for v in order if g.nodes[v]["op"].op in COLLECTIVES}
    ready: dict[str, float] = {}
    es: dict[str, float] = {}
    ends: dict[str, dict[tuple, float]] = {}  # stream -> variant context -> latest end
    for v in order:
        ready[v] = es[v] = max((es[u] + costs[u] for u in g.predecessors(v)), default=0.0)
        if v in lane:
            ctx, seen = g.nodes[v]["ctx"], ends.setdefault(lane[v], {})
            es[v] = max([ready[v]] + [e for c, e in seen.items() if compatible(c, ctx)])
            if not ctx:  # it follows every earlier one: they bound no later collective beyond it
                seen.clear()
            seen[ctx] = max(seen.get(ctx, 0.0), es[v] + costs[v])
    total = max((es[v] + costs[v] for v in order), default=0.0)
    late: dict[str, float] = {}
    ls: dict[str, float] = {}
    nxt: dict[str, tuple] = {}
    starts: dict[str, dict[tuple, tuple]] = {}  # stream -> variant context -> (latest start, id)
    for v in reversed(order):
        late[v] = ls[v] = min((ls[s] for s in g.successors(v)), default=total) - costs[v]
        if v in lane:
            ctx, seen = g.nodes[v]["ctx"], starts.setdefault(lane[v], {})
            later = [s for c, s in seen.items() if compatible(c, ctx)]
            if later:
                nxt[v] = min(later)
                ls[v] = min(ls[v], nxt[v][0] - costs[v])
            if not ctx:
                seen.clear()
            seen[ctx] = min(seen.get(ctx, (ls[v], v)), (ls[v], v))
    return ready, es, late, nxt


def run(cp: Compiled, cfg) -> tuple[Compiled, bool]:
    g = cp.graph
    plan = cp.plan
    probes = cp.probes
    index = {o.id: i for i, o in enumerate(plan.ops)}
    order = list(nx.lexicographical_topological_sort(g, key=lambda v: (index.get(v, 1 << 60), v)))
    pos = {v: i for i, v in enumerate(order)}
    cands = [v for v in order if g.nodes[v]["op"].op in FUSABLE]
    a2a = [v for v in order if g.nodes[v]["op"].op == "all_to_all"]
    report = {"before": len(cands) + len(a2a), "after": len(cands) + len(a2a), "buckets": [], "not_fused": []}
    cp.report[NAME] = report
    # a result written in place must stay a buffer of its own: unpacked, it would be a view
    writes = {t: v for v, d in g.nodes(data=True) for t in written_in_place(d["op"])}  # tensor -> its writer
    for v in [v for v in cands if set(g.nodes[v]["op"].out) & writes.keys()]:
        o = next(n for n in g.nodes[v]["op"].out if n in writes)
        report["not_fused"].append({"ops": [v], "reason": f"not packed with any collective: its result '{o}' is"
                                                          f" overwritten in place by '{writes[o]}'"})
        cands.remove(v)
    for v in a2a:
            report["not_fused"].append({"ops": [v], "reason": "all_to_all is never fused (per-peer chunks would"
                                                              " interleave)"})
    if len(cands) < 2:
        return cp, False

    # ancestor bitmasks over candidates: mask[v] has bit i if candidate i reaches v
    bit = {v: 1 << i for i, v in enumerate(cands)}
    mask: dict[str, int] = {}
    for v in order:
        m = 0
        for u in g.predecessors(v):
            m |= mask[u] | bit.get(u, 0)
        mask[v] = m

    # earliest start and slack (data edges and comm order, at representative sizes)
    model = CostModel(cfg.profile, plan.groups)
    tuned = {**plan.tuned, **cfg.tuned}
    costs = op_costs(cp, model, rep_bindings(cp, (), tuned))
    streams = stream_pool(cp, cfg.num_streams)
    ready, es, late, nxt = _timing(cp, order, costs, streams)

    def delayed(ms: list[str]) -> str | None:
        """Packed, the members start when the last one's data is ready (and the comm order lets
        the first one start); a member whose readers, or the next collective on its stream
        (unless packed with it), cannot wait that long is delayed on the critical path."""
        start = max([es[ms[0]]] + [ready[m] for m in ms])
        tol = max(0.01, 0.01 * sum(costs[m] for m in ms))
        for m in ms:
            limit = late[m]
            if m in nxt and nxt[m][1] not in ms:
                limit = min(limit, nxt[m][0] - costs[m])
            slack = limit - es[m]
            if start - es[m] > slack + tol:
                return (f"would delay {m} by {_us(start - es[m])} on the critical path"
                        f" (slack {_us(max(slack, 0.0))})")
        return None

    cap = cfg.bucket_cap_mb * 1e6
    groups: dict[tuple, list[str]] = {}
    for v in cands:
        groups.setdefault(_key(cp, v, streams), []).append(v)
    keys = list(groups)
    for i, k in enumerate(keys):  # explain near misses between keys
        for k2 in keys[i + 1:]:
            if k[0] == k2[0]:
                u, w = groups[k][0], groups[k2][0]
                report["not_fused"].append({"ops": [u, w], "reason": _why_differs(cp, u, w, k, k2)})

    def nbytes(name):
        return _max_bytes(cp, name)

    buckets: list[list[str]] = []
    for k, members in groups.items():
        cur: list[str] = []
        cur_bits = cur_bytes = 0
        for c in members:
            op = g.nodes[c]["op"]
            reason = None
            if cur:
                specs = [cp.tensors[g.nodes[m]["op"].x] for m in cur + [c]]
                if pack_dim(specs, probes, k[2]) is None:
                    reason = "shapes cannot be packed along one dim"
                elif mask[c] & cur_bits:
                    dep = next(m for m in cur if mask[c] & bit[m])
                    reason = f"depends on {dep} (a path between them: merging would deadlock or reorder)"
                elif cur_bytes + nbytes(op.x) > cap:
                    reason = f"bucket would exceed the byte cap ({cfg.bucket_cap_mb:g} MB at the dims' maximum)"
                else:
                    reason = delayed(cur + [c])
            if reason:
                report["not_fused"].append({"ops": [cur[-1], c], "reason": reason})
                if len(cur) > 1:
                    buckets.append(cur)
                cur, cur_bits, cur_bytes = [], 0, 0
            cur.append(c)
            cur_bits |= bit[c]
            cur_bytes += nbytes(op.x)
        if len(cur) > 1:
            buckets.append(cur)
    if not buckets:
        return cp, False

    # profitability, decided at every bucket the bucket's scope can see: fuse when the packed
    # collective's worst-case loss against the better choice per bucket is smaller than the
    # separate collectives' (a bucket rated slower than separate at some size is not fused blindly)
    views = Readers(cp)
    kept = []
    for members in buckets:
        at = allowed_buckets(cp, g.nodes[members[0]]["ctx"], tuned)
        lay = layout(cp, cfg, members, views)
        rows = [(b, *estimate(cp, cfg, model, members, lay, b)) for b in at]
        if lay.unpack:
            members, lay, rows = copy_or_leave_out(cp, cfg, model, members, lay, rows, views, report)
        loss_fused = max(f - min(s, f) for _, s, f in rows)
        loss_sep = max(s - min(s, f) for _, s, f in rows)
        worst = max(rows, key=lambda r: r[2] - r[1])
        best = max(rows, key=lambda r: r[1] - r[2])
        if loss_fused >= loss_sep:
            slower = f"packed {worst[2]:.1f} us vs {worst[1]:.1f} us separate at {at_text(worst[0])}"
            reason = (f"unprofitable: {slower}" if best[2] >= best[1] else
                      f"not fused at every size: {slower}, a larger worst-case loss ({loss_fused:.1f} us) than"
                      f" not fusing ({loss_sep:.1f} us, at most {best[1] - best[2]:.1f} us at {at_text(best[0])})")
            report["not_fused"].append({"ops": members[:2], "reason": reason})
        else:
            kept.append((members, lay, rows, loss_fused, loss_sep))
    kept = _without_cycles(g, sorted(kept, key=lambda b: pos[b[0][0]]), report)
    if not kept:
        return cp, False
    ictx = InferCtx(cp.tensors, plan.params, plan.dims, plan.groups, probes)
    for n, (members, lay, rows, loss_fused, loss_sep) in enumerate(kept):
        b = _rewrite(cp, members, lay, f"{g.nodes[members[0]]['op'].op}.fused{n}", ictx)
        mid = rows[len(rows) // 2]
        b["estimate"] = {"separate_us": round(mid[1], 2), "packed_us": round(mid[2], 2), "at": dict(mid[0]),
                         "per_bucket": [{"at": dict(at), "separate_us": round(sep, 2), "packed_us": round(f, 2)}
                                        for at, sep, f in rows],
                         "decision": "packed at every bucket" if loss_fused == 0 else
                         f"smallest worst-case loss: {loss_fused:.1f} us packed vs {loss_sep:.1f} us separate"}
        report["buckets"].append(b)
    buckets = [m for m, *_ in kept]
    report["after"] = report["before"] - sum(len(b) - 1 for b in buckets)
    rebuild_edges(cp)
    return cp, True


def _max_bytes(cp: Compiled, name: str) -> int:
    t = cp.tensors[name]
    upper = {k: d.hi for k, d in cp.plan.dims.items()}
    return nbytes_at(t, upper)


def _rewrite(cp: Compiled, members: list[str], lay: Layout, bid: str, ictx) -> dict:
    g = cp.graph
    ops, ctx, xs, specs, coll_dim = operands(cp, members)
    p = lay.p
    # an input an earlier bucket's producer already writes into that bucket's slot is a view now
    inplace = [x for x in lay.inplace if not cp.tensors[x].alias_of]
    whys = dict(lay.copied) | {x: "views of other tensors" for x in lay.inplace if x not in inplace}
    copied = [(x, whys[x]) for x in xs if x in whys]
    packed, gathered = f"{bid}.packed", f"{bid}.out"

    # offsets along the pack dim; zero-copy producers write straight into their slot
    offset = 0
    for x, s in zip(xs, specs, strict=True):
        if x in inplace:
            prod = cp.tensors[x].producer
            g.nodes[prod]["out_slot"] = (packed, p, offset, s.shape[p])
        offset = _add(offset, s.shape[p])

    pack = Cat(op="cat", id=f"{bid}.pack", xs=xs, dim=p, out=[packed], inplace=list(inplace))
    # the members' pins name one stream (the fusion key): the fused collective keeps it; the pack,
    # unpack and copies are not collectives and stay the stream planner's to place
    pin = next((o.stream for o in ops if o.stream), None)
    coll = ops[0].model_copy(update={"id": bid, "x": packed, "out": [gathered], "fused_from": list(members),
                                     "stream": pin})
    outs = [o.out[0] for o in ops]
    out_specs = [cp.tensors[o] for o in outs]
    sizes = [s.shape[p] for s in out_specs]
    # a result some reader needs whole is a piece of the packed result copied out under its name
    pieces = [f"{bid}.{o}" if o in lay.unpack else o for o in outs]
    unpack = Split(op="split", id=f"{bid}.unpack", x=gathered, sizes=[_text(d) for d in sizes], dim=p, out=pieces)
    copies = [Copy(op="copy", id=f"{bid}.copy.{o}", x=f"{bid}.{o}", out=[o]) for o in outs if o in lay.unpack]

    g.remove_nodes_from(members)
    for o in outs:
        del cp.tensors[o]
    for x in inplace:
        t = cp.tensors[x]
        t.alias_of, t.contiguous = packed, (p == 0)
    for op in (pack, coll, unpack, *copies):
        for spec in op.infer(ictx):
            spec.producer = op.id
            cp.tensors[spec.name] = spec
        g.add_node(op.id, op=op, ctx=ctx, stream=op.stream or "main", waits=[], records=[])
    upper = {k: d.hi for k, d in cp.plan.dims.items()}
    n_in = len(inplace)
    reasons: dict[str, list] = {}
    for x, w in copied:
        reasons.setdefault(w, []).append(x)
    copied_text = "; ".join(f"{', '.join(names)} ({w})" for w, names in reasons.items())
    if n_in == len(xs):
        form, why = "inplace", "every producer writes straight into its slot of the packed buffer (no cat copy)"
    elif n_in:
        form = "mixed"
        why = f"{n_in} of {len(xs)} written in place ({', '.join(inplace)}); copied: {copied_text}"
    else:
        form, why = "cat", "cat copy of " + copied_text
    if lay.why_dim:
        why += "; " + lay.why_dim
    if lay.unpack:
        why += "; copied out of the packed result: " + "; ".join(f"{o} ({w})" for o, w in lay.unpack.items())
    return {
        "id": bid, "kind": coll.op, "group": coll.group, "dim": coll_dim, "pack_dim": p, "stream": coll.stream,
        "members": list(members), "tensors": xs, "packing": form, "why": why,
        "packed_bytes_max": nbytes_at(cp.tensors[packed], upper),
        "out_bytes_max": nbytes_at(cp.tensors[gathered], upper),
        "dtype_bytes": DTYPES[specs[0].dtype],
        # what fusion adds to memory: the pack's copies, and results copied out of the packed result
        "copied_bytes_max": sum(nbytes_at(cp.tensors[x], upper) for x, _ in copied)
        + sum(nbytes_at(cp.tensors[o], upper) for o in lay.unpack),
        "unpack_copies": [{"tensor": o, "why": w} for o, w in lay.unpack.items()],
    }


def _add(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return Bin("+", Num(a) if isinstance(a, int) else a, Num(b) if isinstance(b, int) else b)


def _text(d):
    return d if isinstance(d, int) else unparse(d)


__all__ = ["run", "NAME"]
