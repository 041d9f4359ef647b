"""How one bucket of fuse-collectives packs: the pack dim, which members' producers write into
their slot, which inputs the pack copies and which results are copied out of the packed result
(a reader needs them whole), and the estimate that decides between packing, copying and leaving a
member out."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..cost import gather_takes_p2p
from ..graph import Compiled
from ..shapes import nbytes_at

__all__ = ["INPLACE_WRITERS", "Layout", "layout", "estimate", "copy_or_leave_out", "pack_dim", "strided",
           "strided_write_pays", "at_text", "operands"]


INPLACE_WRITERS = {"gemm", "add", "copy"}
# tensor-sized passes an elementwise producer makes (add: read a, read b, write out); a GEMM
# writes its tiles with a row stride at no extra cost, an elementwise kernel into a strided
# slot does not vectorize (profile.strided_write_factor)
ELEMENTWISE_PASSES = {"add": 3, "copy": 2}

def strided_write_pays(op_kind: str, cfg) -> bool:
    """In place beats producing contiguously and copying in the pack (2 passes)."""
    k = ELEMENTWISE_PASSES.get(op_kind)
    return k is None or (cfg.profile.strided_write_factor - 1.0) * k < 2.0


def _pack_dims(specs, probes, coll_dim: int | None) -> list[int]:
    """The dims along which members can be concatenated (all other dims agree), preferred first."""
    rank = specs[0].rank
    if any(s.rank != rank for s in specs):
        return []
    order = [rank - 1] + list(range(rank - 1)) if rank else []
    return [p for p in order if p != coll_dim and all(
        all(probes.equal(a, b) for j, (a, b) in enumerate(zip(specs[0].shape, s.shape, strict=True)) if j != p)
        for s in specs[1:])]


def pack_dim(specs, probes, coll_dim: int | None):
    """The preferred dim along which members can be concatenated, or None."""
    return next(iter(_pack_dims(specs, probes, coll_dim)), None)


def strided(spec, p: int) -> bool:
    """A piece cut from a contiguous buffer along dim p has gaps between its rows."""
    return not (p == 0 or all(d == 1 for d in spec.shape[:p]))


def at_text(b: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in b.items()) or "static shapes"


@dataclass
class Layout:
    """How one bucket packs."""
    p: int                                   # the pack dim
    inplace: list[str]                       # inputs whose producers write into their slot
    copied: list[tuple[str, str]]            # (input, why) the pack copies
    unpack: dict[str, str] = field(default_factory=dict)  # result -> why it is copied out
    why_dim: str = ""                        # why not the preferred dim, when it is not


def _slot_refusal(cp: Compiled, cfg, x: str, xs: list[str], ctx, p: int, views, members) -> str | None:
    """Why x's producer cannot write straight into its slot of the packed buffer (None: it can)."""
    t = cp.tensors[x]
    if cfg.packing == "cat":
        return "packing=cat requested"
    if t.producer is None:
        return f"plan {t.kind}s"
    d = cp.graph.nodes[t.producer]
    pop = d["op"]
    if pop.op not in INPLACE_WRITERS:
        return f"made by {pop.op}, which cannot write into a slot"
    if t.alias_of or len(pop.out) != 1:
        return "views of other tensors"
    if d["ctx"] != ctx:
        return "made inside a variant"
    if xs.count(x) > 1:
        return "twice in the bucket"
    hit = views.trouble(x, p != 0, skip=members)
    if hit:
        return "reshaped by a view, which needs them contiguous" if hit[0] == "view" else hit[1]
    if cfg.packing != "inplace" and strided(t, p) and not strided_write_pays(pop.op, cfg):
        f = cfg.profile.strided_write_factor
        return (f"made by {pop.op}: an elementwise write into a strided slot costs {f:g}x a contiguous"
                " one, so producing contiguously and copying in the pack is cheaper")
    return None


def operands(cp: Compiled, members: list[str]) -> tuple:
    """(ops, variant context, inputs, their specs, the collective's dim or None) of a bucket."""
    g = cp.graph
    ops = [g.nodes[m]["op"] for m in members]
    xs = [o.x for o in ops]
    specs = [cp.tensors[x] for x in xs]
    coll_dim = getattr(ops[0], "dim", None)
    coll_dim = None if coll_dim is None else coll_dim % specs[0].rank
    return ops, g.nodes[members[0]]["ctx"], xs, specs, coll_dim


def layout(cp: Compiled, cfg, members: list[str], views) -> Layout:
    """Of the dims the bucket can pack along, the one that copies the fewest results out of the
    packed result (a reader that needs one whole), then the fewest inputs into it, then the
    preferred one (the last dim, then the first ones in order)."""
    ops, ctx, xs, specs, coll_dim = operands(cp, members)
    tried = []
    for i, p in enumerate(_pack_dims(specs, cp.probes, coll_dim)):
        unpack = {}
        for o in ops:
            hit = views.trouble(o.out[0], strided(cp.tensors[o.out[0]], p))
            if hit:
                unpack[o.out[0]] = hit[1]
        inplace, copied = [], []
        for x in xs:
            why = _slot_refusal(cp, cfg, x, xs, ctx, p, views, members)
            if why:
                copied.append((x, why))
            else:
                inplace.append(x)
        tried.append(((len(unpack), len(copied), i), Layout(p, inplace, copied, unpack)))
    first, best = tried[0][1], min(tried, key=lambda t: t[0])[1]
    if best is not first:
        kept = [f"{o} stays whole ({w})" for o, w in first.unpack.items() if o not in best.unpack]
        kept += [f"{x} is written in place (along dim {first.p} it is copied: {dict(first.copied)[x]})"
                 for x in best.inplace if x not in first.inplace]
        best.why_dim = f"packed along dim {best.p}, not {first.p}, so that " + "; ".join(kept)
    return best


def _copy_us(p, nbytes: float) -> float:
    return p.kernel_us + 2 * nbytes / (p.hbm_gbps * 1e3)


def estimate(cp: Compiled, cfg, model, members, lay: Layout, binding) -> tuple[float, float]:
    """(separate, packed) estimated us for a bucket."""
    g = cp.graph
    ops = [g.nodes[m]["op"] for m in members]
    sep = sum(model.op_us(o, cp.tensors, binding) for o in ops)
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
    if w > 1 and ops[0].op == "all_gather" and p.p2p_gbps > 0 and moved_in >= p.p2p_min_bytes \
            and all(gather_takes_p2p(o, cp.tensors[o.x]) for o in ops):
        # the same choice the cost model makes for one gather (copy-engine pushes when available)
        coll = min(coll, p.p2p_latency_us + received / (p.p2p_gbps * 1e3))
    copied = sum(nbytes_at(cp.tensors[x], binding) for x, _ in lay.copied)
    pack = _copy_us(p, copied) if copied else 0.0
    unpack = sum(_copy_us(p, nbytes_at(cp.tensors[o], binding)) for o in lay.unpack)
    return sep, coll + pack + unpack


def copy_or_leave_out(cp: Compiled, cfg, model, members, lay: Layout, rows, views, report):
    """Results some reader needs whole are copied out of the packed result; where that copy costs
    more than the member's own collective saves (the smaller worst-case loss against the best of
    all separate, all packed with the copies, and the others packed without those members), the
    members are left out and reported."""
    g = cp.graph
    alone = [m for m in members if g.nodes[m]["op"].out[0] in lay.unpack]
    rest = [m for m in members if m not in alone]
    if len(rest) < 2:
        return members, lay, rows
    lay_r = layout(cp, cfg, rest, views)
    rows_r = [(b, *estimate(cp, cfg, model, rest, lay_r, b)) for b, _, _ in rows]
    solo = [sum(model.op_us(g.nodes[m]["op"], cp.tensors, b) for m in alone) for b, _, _ in rows]
    three = [(s, f, fr + so) for (_, s, f), (_, _, fr), so in zip(rows, rows_r, solo, strict=True)]
    loss = [max(r[k] - min(r) for r in three) for k in range(3)]
    if not loss[2] < min(loss[0], loss[1]):
        return members, lay, rows
    i = max(range(len(three)), key=lambda j: three[j][1] - three[j][2])
    for m in alone:
        o = g.nodes[m]["op"].out[0]
        report["not_fused"].append({"ops": [m, rest[0]], "reason": (
            f"left out of the packed {g.nodes[m]['op'].op}: its result '{o}' would be a view of the packed"
            f" result, but {lay.unpack[o]}, and copying it out costs more than its own collective saves"
            f" ({three[i][1]:.1f} us all packed, with the copy, vs {three[i][2]:.1f} us with it on a collective"
            f" of its own, at {at_text(rows[i][0])})")})
    return rest, lay_r, rows_r
