"""Hazards proven absent, statically, on a compiled plan (called from verify()).

verify() proves every cross-stream read is ordered after its producer (read-after-write).
This adds what that does not cover, each failure a located HazardError:

- write-after-write: two ops that write overlapping bytes of one buffer (slot writes into
  packed buffers included) in a variant combination where both run;
- write-after-read: an op writes into a buffer (a slot of a packed buffer, or a buffer that
  others read through an alias) that another op still reads, with no chain of stream order
  and events putting the read first;
- buffer reuse across streams: a packed buffer is allocated on the caller's stream (its
  memory may have been freed by the caller's earlier work), so a side-stream op that writes
  into it must be ordered after the caller's stream; buffers made by side-stream ops are
  allocated on their own stream and held to the call's end, which joins every stream;
- collective order: every collective of one group is issued from one stream, and a region
  whose gate uses a fact that can differ between ranks issues the same collectives in the
  same order in each of its variants (ranks may pick different variants);
- capture legality of capture-gated variants (gate requires `capturing`): a graph captured at
  a bucket is replayed for every size up to it on padded rows, so such a variant must not
  make results depend on padded rows (padding_sensitive: no gemm that sums over the bucketed
  dim, no shard or reduce-scatter that cuts it into per-rank chunks, no gather, all_to_all or
  cat that puts rows after padded ones along it).
  Host syncs inside externs are not visible to the planner (externs are opaque).
"""

from __future__ import annotations

from .errors import Diagnostic, PlanError
from .expr import Bin, Name, eval_int, free_names, parse
from .graph import Compiled, compatible
from .ops import COLLECTIVES, VIEW_OPS
from .ordering import Order, happens_before, is_view
from .predicates import RANK_VARYING
from .shapes import fmt_dim

__all__ = ["check_hazards", "HazardError", "padding_sensitive"]


class HazardError(PlanError):
    """A compiled plan could race, hang or compute padded garbage; names the op and where it was written."""


def _fail(cp: Compiled, op_id: str, msg: str, hint: str | None = None, code: str = "stream"):
    loc = _loc(cp, op_id)
    raise HazardError([Diagnostic(code, msg, loc, hint)])


def _loc(cp: Compiled, op_id: str):
    locs = cp.plan.locs
    if op_id in locs:
        return locs[op_id]
    if op_id in cp.graph:
        op = cp.graph.nodes[op_id]["op"]
        for m in list(getattr(op, "fused_from", []) or []) + list(op.inputs()):
            if m in locs:
                return locs[m]
    base = op_id.split(".")[0]
    return locs.get(base)


def check_hazards(cp: Compiled, order: Order | None = None) -> None:
    """order: the ordering verify() already proved (built here when not given)."""
    _collective_streams(cp)
    _rank_varying_collectives(cp)
    _capture_legal(cp)
    if cp.schedule and "derive-events" in cp.passes_run:
        hb = happens_before(cp, order)
        _writes(cp, hb)
        _reuse(cp, hb)


# ---------------------------------------------------------------- buffers and regions

def _writes_of(cp: Compiled, v: str) -> list[tuple]:
    """(buffer, region) written by v; region = (dim, offset, size) or None for all of it."""
    d = cp.graph.nodes[v]
    op = d["op"]
    if op.op in VIEW_OPS:
        return []
    slot = d.get("out_slot")
    if slot:
        packed, dim, off, size = slot
        return [(packed, (dim, off, size))]
    if op.op == "cat" and op.inplace:
        # the pack copies only the members that were not written in place
        out, off = [], 0
        for x in op.xs:
            size = cp.tensors[x].shape[op.dim % cp.tensors[x].rank]
            if x not in op.inplace:
                out.append((op.out[0], (op.dim % cp.tensors[x].rank, off, size)))
            off = off + size if isinstance(off, int) and isinstance(size, int) else Bin("+", _e(off), _e(size))
        return out
    return [(n, None) for n in op.out if n in cp.tensors]


def _reads_of(cp: Compiled, v: str) -> list[tuple]:
    """(buffer, region, tensor read) for each input of v, through aliases and slots (a view of a
    slot member reads, conservatively, all of that member's slot)."""
    g = cp.graph
    out = []
    for n in g.nodes[v]["op"].inputs():
        if n not in cp.tensors:
            continue
        cur, hit = n, None
        for _ in range(64):
            p = cp.tensors[cur].producer
            slot = g.nodes[p].get("out_slot") if p is not None else None
            if slot and cur in g.nodes[p]["op"].out:
                hit = (slot[0], (slot[1], slot[2], slot[3]), n)
                break
            if not cp.tensors[cur].alias_of:
                break
            cur = cp.tensors[cur].alias_of
        out.append(hit or (cur, None, n))
    return out


def _e(x):
    from .expr import Num
    return Num(x) if isinstance(x, int) else parse(x) if isinstance(x, str) else x


def _samples(cp: Compiled) -> list[dict]:
    dims = cp.plan.dims
    if not dims:
        return [{}]
    lead = cp.plan.token_dim
    out = []
    for b in dims[lead].buckets + [dims[lead].lo, dims[lead].hi]:
        out.append({**{n: d.hi for n, d in dims.items()}, lead: b})
    return out


def _overlap(cp: Compiled, r1, r2) -> bool:
    if r1 is None or r2 is None or r1[0] != r2[0]:
        return True
    for b in _samples(cp):
        b = {**cp.plan.params, **b}
        a0, a1 = eval_int(r1[1], b), eval_int(r1[1], b) + eval_int(r1[2], b)
        c0, c1 = eval_int(r2[1], b), eval_int(r2[1], b) + eval_int(r2[2], b)
        if a0 < c1 and c0 < a1:
            return True
    return False


def _writes(cp: Compiled, hb) -> None:
    g = cp.graph
    writers: dict[str, list] = {}
    for v in cp.schedule:
        for buf, reg in _writes_of(cp, v):
            writers.setdefault(buf, []).append((v, reg))
    for buf, ws in writers.items():
        for i, (w1, r1) in enumerate(ws):
            for w2, r2 in ws[i + 1:]:
                if compatible(g.nodes[w1]["ctx"], g.nodes[w2]["ctx"]) and _overlap(cp, r1, r2):
                    s1, s2 = g.nodes[w1]["stream"], g.nodes[w2]["stream"]
                    _fail(cp, w2, f"write-after-write: {w2} on {s2} and {w1} on {s1} both write {_what(buf, r2)}",
                          "each byte of a buffer has one writer per call")
    anc: dict = {}  # producer -> its ancestors (readers of one packed buffer share them)
    for v in cp.schedule:
        if is_view(g, v):
            continue
        for buf, reg, name in _reads_of(cp, v):
            src = cp.tensors[name].producer
            made = None  # what the read value was made from: found only when another writer needs it
            for w, wr in writers.get(buf, []):
                if w == v or w == src or (src is not None and g.has_edge(w, src)):
                    continue  # the read value's own producer, or a writer feeding it directly (slot producers of a pack)
                if not compatible(g.nodes[w]["ctx"], g.nodes[v]["ctx"]):
                    continue
                if not _overlap(cp, reg, wr):
                    continue
                if made is None:
                    made = anc.get(src)
                    if made is None:
                        made = anc[src] = _ancestors(g, src) if src is not None else set()
                if w in made:
                    continue
                if not hb(v, w):
                    alias = f" through the alias {name}" if name != buf else ""
                    _fail(cp, w, f"write-after-read: {w} on {g.nodes[w]['stream']} writes {_what(buf, wr)}, which {v}"
                                 f" on {g.nodes[v]['stream']} still reads{alias}; no stream order or event puts the"
                                 " read first", "write into a fresh buffer, or make the writer depend on the reader")


def _ancestors(g, v) -> set:
    import networkx as nx
    return nx.ancestors(g, v)


def _what(buf: str, reg) -> str:
    if reg is None:
        return f"buffer {buf}"
    dim, off, size = reg
    from .shapes import fmt_dim
    return f"slot [{fmt_dim(off)}:+{fmt_dim(size)}] (dim {dim}) of {buf}"


def _reuse(cp: Compiled, hb) -> None:
    """A packed buffer is allocated on the caller's stream when the schedule reaches its first
    writer; its memory may have been freed by the caller's earlier work, so a side-stream
    writer must be ordered after the caller's stream (a wait on entry or on a main event)."""
    g = cp.graph
    seen: dict[str, int] = {}
    ordered: dict[str, bool] = {}
    for v in cp.schedule:
        if is_view(g, v):
            continue
        s = g.nodes[v]["stream"]
        if s != "main" and not ordered.get(s):
            for e in g.nodes[v]["waits"]:
                r = cp.events.get(e, {}).get("op")
                if e == "entry" or (r is not None and g.nodes[r]["stream"] == "main") or (
                        r is not None and ordered.get(g.nodes[r]["stream"])):
                    ordered[s] = True
        slot = g.nodes[v].get("out_slot")
        if slot and s != "main" and not ordered.get(s):
            seen[slot[0]] = 1
            _fail(cp, v, f"buffer reuse across streams: {v} on {s} writes into {slot[0]}, allocated on main when the"
                         f" schedule reaches it, but nothing orders {s} after main's earlier work: the memory may"
                         " still be in use there", "the first op of a side stream waits on entry or on a main event")


# ---------------------------------------------------------------- collectives

def _collective_streams(cp: Compiled) -> None:
    g = cp.graph
    first: dict[str, tuple] = {}
    for v in cp.schedule or list(g.nodes):
        op = g.nodes[v]["op"]
        if op.op not in COLLECTIVES:
            continue
        s = g.nodes[v]["stream"]
        if op.group not in first:
            first[op.group] = (v, s)
        elif first[op.group][1] != s:
            u, su = first[op.group]
            _fail(cp, v, f"collectives over group '{op.group}' are issued from two streams ({u} on {su}, {v} on {s}):"
                         " ranks can reach them in different orders and hang",
                  "keep every collective of one group on one stream (drop the stream pin)")


def _coll_sig(cp: Compiled, v: str) -> tuple:
    op = cp.graph.nodes[v]["op"]
    t = cp.tensors[op.inputs()[0]]
    return (op.op, op.group, getattr(op, "dim", None), t.dtype, str(t.shape))


def _rank_varying_collectives(cp: Compiled) -> None:
    g = cp.graph
    checked = {rid for rid, vs in cp.variants.items() if len(vs) >= 2 and any(v.uses & RANK_VARYING for v in vs)}
    if not checked:
        return
    issued: dict[tuple, list] = {}  # (region, variant) -> its collectives in schedule order, one walk
    for n in cp.schedule or list(g.nodes):
        if g.nodes[n]["op"].op in COLLECTIVES:
            for rv in g.nodes[n]["ctx"]:
                if rv[0] in checked:
                    issued.setdefault(rv, []).append(_coll_sig(cp, n))
    for rid, vs in cp.variants.items():
        if rid not in checked:
            continue
        seqs = {v.name: issued.get((rid, v.name), []) for v in vs}
        ref = vs[-1].name
        for v in vs[:-1]:
            if seqs[v.name] != seqs[ref]:
                raise HazardError([Diagnostic(
                    "variant", f"region '{rid}': variant '{v.name}' issues collectives {seqs[v.name] or 'none'} but"
                    f" '{ref}' issues {seqs[ref] or 'none'}, and the gate uses {sorted(v.uses & RANK_VARYING)[0]},"
                    " which can differ between ranks: ranks could issue different collectives and hang",
                    v.loc or cp.plan.regions[rid].loc,
                    "gate on rank-uniform facts, or issue the same collectives in every variant")])


# ---------------------------------------------------------------- capture

def _requires_capturing(when) -> bool:
    if when is None:
        return False
    if isinstance(when, Name):
        return when.id == "capturing"
    if isinstance(when, Bin) and when.op == "and":
        return _requires_capturing(when.l) or _requires_capturing(when.r)
    return False


# ops whose results reach model code or change layout: a padded layout stops being tracked there
_LAYOUT_ENDS = {"extern", "view"}


def _mentions(d, dim: str) -> bool:
    """A dim expression that grows with `dim`."""
    return not isinstance(d, int) and dim in free_names(_e(d))


def padding_sensitive(cp: Compiled, dim: str | None = None) -> dict[str, str]:
    """op -> why a plan result depends on rows padded past the real ones along `dim` (the
    bucketed dim: the plan's first), where a graph captured at a bucket replays smaller sizes and
    its results are sliced back to the real size. A gemm that sums over `dim` mixes padded rows
    into every value. A gather, all_to_all or cat along `dim` lays blocks of the bucket's size one
    after another, and a shard or reduce-scatter keeps a bucket-sized chunk: the real rows are no
    longer the leading ones. Those layouts are followed through the ops after them (row-wise work,
    copies, collectives); a gather of a shard's chunks along the same dim restores the rows, a cut
    along the dim (slice, split) takes whole blocks as the dims name them, and model code and views
    are trusted. What reaches a plan output that is sliced back along `dim` is reported, at the op
    that made the layout."""
    dims = list(cp.plan.dims)
    dim = dim or (dims[0] if dims else None)
    if dim is None:
        return {}
    g, tensors = cp.graph, cp.tensors

    def mentions(d) -> bool:
        return _mentions(d, dim)
    out: dict[str, str] = {}
    state: dict[str, dict[int, tuple]] = {}  # tensor -> {axis: (kind, op, why)}: a layout that is not prefix rows
    for n in cp.schedule or list(g.nodes):
        op = g.nodes[n]["op"]
        if op.op == "gemm" and mentions(tensors[op.b].shape[1]):
            out[n] = f"gemm {n} sums over {dim} (K = {fmt_dim(tensors[op.b].shape[1])})"
            continue
        if op.op in _LAYOUT_ENDS:
            continue
        ins = [state.get(x, {}) for x in op.inputs()]
        merged: dict[int, tuple] = {}
        for st in ins if op.op != "gemm" else ins[:1]:  # a gemm keeps a's rows (axis 0)
            for ax, v in st.items():
                if op.op != "gemm" or ax == 0:
                    merged.setdefault(ax, v)
        t0 = tensors[op.inputs()[0]] if op.inputs() else None
        ax = getattr(op, "dim", 0 if op.op == "all_to_all" else None)  # all_to_all: along rows
        if t0 is not None and t0.rank and isinstance(ax, int):
            ax %= t0.rank
        if op.op in ("slice", "split") and ax is not None:
            merged.pop(ax, None)  # the dims name whole blocks
        elif op.op in ("all_gather", "all_to_all", "shard", "reduce_scatter", "cat") and ax is not None \
                and t0 is not None and t0.rank and mentions(t0.shape[ax]):
            prev = merged.pop(ax, None)
            if op.op == "all_gather" and prev is not None and prev[0] == "chunked":
                pass  # the shard's chunks gathered back in order: the rows are the leading ones again
            elif op.op == "cat" and not any(mentions(tensors[x].shape[ax]) for x in op.xs[:-1]):
                pass  # only the last piece grows with the dim
            else:
                kind = "chunked" if op.op in ("shard", "reduce_scatter") else "blocked"
                how = (f"cuts {dim} into per-rank chunks" if kind == "chunked" else
                       f"lays blocks of {dim} rows (padded ones included) one after another")
                merged[ax] = (kind, n, f"{op.op} {n} {how}")
        if merged:
            for o in op.out:
                r = tensors[o].rank if o in tensors else 0
                st = {a: v for a, v in merged.items() if a < r}
                if st:
                    state[o] = st
    for o in cp.plan.outputs:
        t = tensors.get(o)
        for ax, (_, src, why) in state.get(o, {}).items():
            if t is not None and ax < t.rank and mentions(t.shape[ax]):
                out.setdefault(src, why + f", and output '{o}' is sliced back along it")
    return out


def _cuts(cp: Compiled, dim: str) -> dict[str, str]:
    """shard / reduce-scatter ops that cut `dim` into per-rank chunks (refused in a variant that
    runs only under capture, whatever follows them)."""
    out = {}
    for n in cp.graph.nodes:
        op = cp.graph.nodes[n]["op"]
        if op.op in ("shard", "reduce_scatter"):
            t = cp.tensors[op.x]
            if _mentions(t.shape[op.dim % t.rank], dim):
                out[n] = f"{op.op} {n} cuts {dim} into per-rank chunks"
    return out


def _capture_legal(cp: Compiled) -> None:
    dims = list(cp.plan.dims)
    if not dims:
        return
    gated: dict[tuple, int] = {}  # (region, variant) of every capture-gated variant -> its rank
    for rid, vs in cp.variants.items():
        for var in vs:
            if _requires_capturing(var.when):
                gated.setdefault((rid, var.name), len(gated))
    if not gated:
        return
    sensitive = {**_cuts(cp, dims[0]), **padding_sensitive(cp, dims[0])}
    # the failure reported is the first by variant, then by schedule
    worst = None
    for i, n in enumerate(cp.schedule or list(cp.graph.nodes)):
        hits = [c for c in cp.graph.nodes[n]["ctx"] if c in gated]
        if not hits or n not in sensitive:
            continue
        c = min(hits, key=gated.__getitem__)
        if worst is None or (gated[c], i) < worst[0]:
            worst = ((gated[c], i), n, c, sensitive[n])
    if worst is not None:
        _, n, (rid, vname), why = worst
        _fail(cp, n, f"capture: variant '{vname}' of region '{rid}' runs only under graph capture,"
                     f" where it is replayed on rows padded up to the bucket, but {why}: its result"
                     " depends on the padded rows (a data-dependent shape)",
              "move the op out of the capture-gated variant, or gate the variant off capture",
              code="variant")
