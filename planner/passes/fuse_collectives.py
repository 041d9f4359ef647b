"""fuse-collectives: merge independent collectives into packed buckets.

Pre: dce ran. Post: collectives of the same kind, process group, dim, dtype,
reduction (sum and avg never merge), stream pin (the fused collective keeps it) and
variant context with no path between them, whose results no op overwrites in place, within the byte cap,
and whose merge does not delay any member past its slack on the critical path,
are replaced by   pack (cat) -> one collective -> unpack (split into the
original output names). Readers are unchanged. Every rank compiles the same
plan deterministically, so every rank issues the same collectives in the same
order.

Zero-copy packing: a member whose producer can write into a strided slot
(gemm, add, copy) gets `out_slot` and is not copied by the pack; members made by
opaque code or given as plan inputs are copied. The report says which and why.

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
from ..ops import PACKABLE_COLLECTIVES, Cat, Split
from ..shapes import DTYPES
from .assign_streams import pin_target, pin_text, stream_pool

NAME = "fuse-collectives"
INPLACE_WRITERS = {"gemm", "add", "copy"}
FUSABLE = PACKABLE_COLLECTIVES
# tensor-sized passes an elementwise producer makes (add: read a, read b, write out); a GEMM
# writes its tiles with a row stride at no extra cost, an elementwise kernel into a strided
# slot does not vectorize (profile.strided_write_factor)
ELEMENTWISE_PASSES = {"add": 3, "copy": 2}


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


def _strided_write_pays(op_kind: str, cfg) -> bool:
    """In place beats producing contiguously and copying in the pack (2 passes)."""
    k = ELEMENTWISE_PASSES.get(op_kind)
    return k is None or (cfg.profile.strided_write_factor - 1.0) * k < 2.0


def _pack_dim(specs, probes, coll_dim: int | None):
    """A dim along which members can be concatenated: all other dims agree."""
    rank = specs[0].rank
    if any(s.rank != rank for s in specs):
        return None
    order = [rank - 1] + list(range(rank - 1)) if rank else []
    for p in order:
        if coll_dim is not None and p == coll_dim:
            continue
        if all(all(probes.equal(a, b) for j, (a, b) in enumerate(zip(specs[0].shape, s.shape, strict=True)) if j != p)
               for s in specs[1:]):
            return p
    return None


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
        report["not_fused"].append({"ops": [v, "any collective"],
                                    "reason": f"its result '{o}' is overwritten in place by '{writes[o]}'"})
        cands.remove(v)
    for v in a2a:
            report["not_fused"].append({"ops": [v, "any collective"],
                                        "reason": "all_to_all is never fused (per-peer chunks would interleave)"})
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

    # earliest start and slack (single stream estimate at representative sizes)
    model = CostModel(cfg.profile, plan.groups)
    tuned = {**plan.tuned, **cfg.tuned}
    costs = op_costs(cp, model, rep_bindings(cp, (), tuned))
    es: dict[str, float] = {}
    for v in order:
        es[v] = max((es[u] + costs[u] for u in g.predecessors(v)), default=0.0)
    total = max((es[v] + costs[v] for v in order), default=0.0)
    ls: dict[str, float] = {}
    for v in reversed(order):
        ls[v] = min((ls[s] for s in g.successors(v)), default=total) - costs[v]
    slack = {v: ls[v] - es[v] for v in order}

    cap = cfg.bucket_cap_mb * 1e6
    streams = stream_pool(cp, cfg.num_streams)
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
                if _pack_dim(specs, probes, k[2]) is None:
                    reason = "shapes cannot be packed along one dim"
                elif mask[c] & cur_bits:
                    dep = next(m for m in cur if mask[c] & bit[m])
                    reason = f"depends on {dep} (a path between them: merging would deadlock or reorder)"
                elif cur_bytes + nbytes(op.x) > cap:
                    reason = f"bucket would exceed the byte cap ({cfg.bucket_cap_mb:g} MB at the dims' maximum)"
                else:
                    ready = max(es[m] for m in cur + [c])
                    late = [m for m in cur + [c] if ready - es[m] > slack[m] + 1e-6]
                    if late:
                        reason = (f"would delay {late[0]} by {ready - es[late[0]]:.1f} us on the critical path"
                                  f" (slack {slack[late[0]]:.1f} us)")
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
    kept = []
    for members in buckets:
        ctx = g.nodes[members[0]]["ctx"]
        rows = []
        for b in allowed_buckets(cp, ctx, tuned):
            sep, fused = _estimate(cp, cfg, model, members, b)
            rows.append((b, sep, fused))
        loss_fused = max(f - min(s, f) for _, s, f in rows)
        loss_sep = max(s - min(s, f) for _, s, f in rows)
        worst = max(rows, key=lambda r: r[2] - r[1])
        best = max(rows, key=lambda r: r[1] - r[2])
        if loss_fused >= loss_sep:
            slower = f"packed {worst[2]:.1f} us vs {worst[1]:.1f} us separate at {_at(worst[0])}"
            reason = (f"unprofitable: {slower}" if best[2] >= best[1] else
                      f"not fused at every size: {slower}, a larger worst-case loss ({loss_fused:.1f} us) than"
                      f" not fusing ({loss_sep:.1f} us, at most {best[1] - best[2]:.1f} us at {_at(best[0])})")
            report["not_fused"].append({"ops": members[:2], "reason": reason})
        else:
            kept.append((members, rows, loss_fused, loss_sep))
    kept = _without_cycles(g, sorted(kept, key=lambda b: pos[b[0][0]]), report)
    if not kept:
        return cp, False
    ictx = InferCtx(cp.tensors, plan.params, plan.dims, plan.groups, probes)
    for n, (members, rows, loss_fused, loss_sep) in enumerate(kept):
        b = _rewrite(cp, cfg, members, f"{g.nodes[members[0]]['op'].op}.fused{n}", ictx)
        mid = rows[len(rows) // 2]
        b["estimate"] = {"separate_us": round(mid[1], 2), "packed_us": round(mid[2], 2), "at": dict(mid[0]),
                         "per_bucket": [{"at": dict(at), "separate_us": round(sep, 2), "packed_us": round(f, 2)}
                                        for at, sep, f in rows],
                         "decision": "packed at every bucket" if loss_fused == 0 else
                         f"smallest worst-case loss: {loss_fused:.1f} us packed vs {loss_sep:.1f} us separate"}
        report["buckets"].append(b)
    buckets = [m for m, _, _, _ in kept]
    report["after"] = report["before"] - sum(len(b) - 1 for b in buckets)
    rebuild_edges(cp)
    return cp, True


def _at(b: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in b.items()) or "static shapes"


def _can_write_in_place(cp: Compiled, cfg, x: str, ctx) -> bool:
    t = cp.tensors[x]
    if cfg.packing == "cat" or t.producer is None or t.alias_of:
        return False
    d = cp.graph.nodes[t.producer]
    kind = d["op"].op
    return (kind in INPLACE_WRITERS and len(d["op"].out) == 1 and d["ctx"] == ctx
            and (cfg.packing == "inplace" or _strided_write_pays(kind, cfg)))


def _estimate(cp: Compiled, cfg, model, members, binding) -> tuple[float, float]:
    """(separate, packed) estimated us for a bucket."""
    from ..shapes import nbytes_at
    g = cp.graph
    ops = [g.nodes[m]["op"] for m in members]
    sep = sum(model.op_us(o, cp.tensors, binding) for o in ops)
    ctx = g.nodes[members[0]]["ctx"]
    # the packed collective moves the sum of the members' bytes in one launch
    p = model.p
    w = cp.plan.groups.get(ops[0].group, 1)
    moved_in = sum(nbytes_at(cp.tensors[o.x], binding) for o in ops)
    if ops[0].op == "all_gather":
        received = moved_in * (w - 1)
    elif ops[0].op == "reduce_scatter":
        received = moved_in * (w - 1) / w
    else:
        received = 2 * moved_in * (w - 1) / w
    coll = p.coll_latency_us + received / (p.coll_gbps * 1e3) if w > 1 else p.kernel_us
    if w > 1 and ops[0].op == "all_gather" and p.p2p_gbps > 0 and moved_in >= p.p2p_min_bytes:
        # the same choice the cost model makes for one gather (copy-engine pushes when available)
        coll = min(coll, p.p2p_latency_us + received / (p.p2p_gbps * 1e3))
    copied = sum(nbytes_at(cp.tensors[o.x], binding) for o in ops if not _can_write_in_place(cp, cfg, o.x, ctx))
    pack = p.kernel_us + 2 * copied / (p.hbm_gbps * 1e3) if copied else 0.0
    return sep, coll + pack


def _max_bytes(cp: Compiled, name: str) -> int:
    t = cp.tensors[name]
    upper = {k: d.hi for k, d in cp.plan.dims.items()}
    from ..shapes import nbytes_at
    return nbytes_at(t, upper)


def _rewrite(cp: Compiled, cfg, members: list[str], bid: str, ictx) -> dict:
    g = cp.graph
    ops = [g.nodes[m]["op"] for m in members]
    ctx = g.nodes[members[0]]["ctx"]
    xs = [o.x for o in ops]
    specs = [cp.tensors[x] for x in xs]
    coll_dim = getattr(ops[0], "dim", None)
    coll_dim = None if coll_dim is None else coll_dim % specs[0].rank
    p = _pack_dim(specs, cp.probes, coll_dim)
    packed, gathered = f"{bid}.packed", f"{bid}.out"

    # zero-copy: which producers can write straight into their slot
    inplace, copied = [], []
    for x in xs:
        t = cp.tensors[x]
        prod = t.producer
        why = None
        if cfg.packing == "cat":
            why = "packing=cat requested"
        elif prod is None:
            why = f"plan {t.kind}s"
        else:
            pop = g.nodes[prod]["op"]
            if pop.op not in INPLACE_WRITERS:
                why = f"made by {pop.op}, which cannot write into a slot"
            elif t.alias_of or len(pop.out) != 1:
                why = "views of other tensors"
            elif g.nodes[prod]["ctx"] != ctx:
                why = "made inside a variant"
            elif xs.count(x) > 1:
                why = "twice in the bucket"
            elif any(g.nodes[s]["op"].op == "view" for s in g.successors(prod)):
                why = "reshaped by a view, which needs them contiguous"
            elif cfg.packing != "inplace" and not _strided_write_pays(pop.op, cfg):
                f = cfg.profile.strided_write_factor
                why = (f"made by {pop.op}: an elementwise write into a strided slot costs {f:g}x a contiguous"
                       " one, so producing contiguously and copying in the pack is cheaper")
        (copied if why else inplace).append((x, why))
    # offsets along the pack dim
    offset = 0
    for x, s in zip(xs, specs, strict=True):
        if any(x == i for i, _ in inplace):
            prod = cp.tensors[x].producer
            g.nodes[prod]["out_slot"] = (packed, p, offset, s.shape[p])
        offset = _add(offset, s.shape[p])

    pack = Cat(op="cat", id=f"{bid}.pack", xs=xs, dim=p, out=[packed], inplace=[x for x, _ in inplace])
    # the members' pins name one stream (the fusion key): the fused collective keeps it; the pack
    # and unpack are not collectives and stay the stream planner's to place
    pin = next((o.stream for o in ops if o.stream), None)
    coll = ops[0].model_copy(update={"id": bid, "x": packed, "out": [gathered], "fused_from": list(members),
                                     "stream": pin})
    outs = [o.out[0] for o in ops]
    out_specs = [cp.tensors[o] for o in outs]
    sizes = [s.shape[p] for s in out_specs]
    unpack = Split(op="split", id=f"{bid}.unpack", x=gathered, sizes=[_text(d) for d in sizes], dim=p, out=outs)

    g.remove_nodes_from(members)
    for o in outs:
        del cp.tensors[o]
    for x, _ in inplace:
        t = cp.tensors[x]
        t.alias_of, t.contiguous = packed, (p == 0)
    for op in (pack, coll, unpack):
        for spec in op.infer(ictx):
            spec.producer = op.id
            cp.tensors[spec.name] = spec
        g.add_node(op.id, op=op, ctx=ctx, stream=op.stream or "main", waits=[], records=[])
    from ..shapes import nbytes_at
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
        why = f"{n_in} of {len(xs)} written in place ({', '.join(x for x, _ in inplace)}); copied: {copied_text}"
    else:
        form, why = "cat", "cat copy of " + copied_text
    return {
        "id": bid, "kind": coll.op, "group": coll.group, "dim": coll_dim, "pack_dim": p, "stream": coll.stream,
        "members": list(members), "tensors": xs, "packing": form, "why": why,
        "packed_bytes_max": nbytes_at(cp.tensors[packed], upper),
        "out_bytes_max": nbytes_at(cp.tensors[gathered], upper),
        "dtype_bytes": DTYPES[specs[0].dtype],
        "copied_bytes_max": sum(nbytes_at(cp.tensors[x], upper) for x, _ in copied),
    }


def _add(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return Bin("+", Num(a) if isinstance(a, int) else a, Num(b) if isinstance(b, int) else b)


def _text(d):
    return d if isinstance(d, int) else unparse(d)


__all__ = ["run", "NAME"]
