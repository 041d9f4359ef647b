"""fuse-allreduce-norm: all_reduce then add_rmsnorm -> one all_reduce_add_rmsnorm.

Pre: dce ran; runs before fuse-collectives (a packed all_reduce no longer feeds a norm).
Post: every `r = all_reduce(x, g)` (reduce=sum, bf16/fp16) whose result is read by exactly
one op, an `add_rmsnorm(r, residual, w)` (or with r as the residual) in the same variant
context, with no view of r and r not a plan output, is replaced by
`normed, residual_out = all_reduce_add_rmsnorm(x, residual, w, g)` under the norm's id and
output names. Readers are unchanged; r disappears. Refused (and reported with the reason):
other readers, max/min/avg reductions, fp32 (the fused kernels take 16-bit floats), a norm
whose other operand is reduced (all_reduce, reduce_scatter, a fused all-reduce + norm; seen
through views) over another group (the fused op reduces one operand over one group; an operand
that was only gathered is a plain input to it, as to the norm, and fuses), a norm that names its
backend, a norm pinned to another stream than the all_reduce's, a pinned norm whose unpinned
all_reduce shares its group with collectives on another stream than the norm's (the fused op is
a collective, and every collective of one group runs on one stream), and a residual or weight
that depends on r. The fused op keeps the all_reduce's pin (or the norm's, when only the norm
is pinned). Refusals are {"ops": [all_reduce id], "reason"}, the shape of the other fusion reports. The
lowering picks FlashInfer's fused kernel or the collective plus a separate norm per call
(executors/backends/allreduce_norm.py), so fusing never changes what is computed.
"""

from __future__ import annotations

import networkx as nx

from ..graph import Compiled, rebuild_edges
from ..infer import InferCtx
from ..ops import COLLECTIVES, VIEW_OPS, AllReduceAddRmsNorm
from .assign_streams import pin_target, pin_text, stream_pool

NAME = "fuse-allreduce-norm"
FUSED_DTYPES = ("bf16", "fp16")
# collectives whose result is a reduction over their group (a gather only moves shards)
REDUCING = {"all_reduce", "reduce_scatter", "all_reduce_add_rmsnorm"}

__all__ = ["run", "NAME", "describe"]


def _readers(g, v: str, tensor: str) -> list[str]:
    """The ops that read `tensor`, which op `v` makes (edges carry the names read)."""
    return sorted(u for u in g.successors(v) if tensor in g.edges[v, u]["tensors"])


def _reduced_over(cp: Compiled, name: str) -> str | None:
    """The group `name` is a reduction over, looking through views (None when no reducing
    collective makes it)."""
    while True:
        p = cp.tensors[name].producer
        if p is None or p not in cp.graph:
            return None
        op = cp.graph.nodes[p]["op"]
        if op.op not in VIEW_OPS:
            return op.group if op.op in REDUCING else None
        name = op.inputs()[0]


def _group_elsewhere(cp: Compiled, v: str, group: str, target: str, streams: list[str]) -> list[str]:
    """'<op> on <stream>' for each collective over `group`, other than `v`, whose stream is not `target`."""
    away = []
    for u in sorted(cp.graph.nodes):
        op = cp.graph.nodes[u]["op"]
        if u != v and op.op in COLLECTIVES and op.group == group:
            s = pin_target(cp.plan, op, streams)
            if s != target:
                away.append(f"{u} on {s}")
    return away


def _refusal(cp: Compiled, v: str, claimed: set, streams: list[str]) -> tuple[str | None, str | None, str | None]:
    """(norm op id, the norm's other operand, None) when `v` can be fused, else (None, None, reason)."""
    g = cp.graph
    op = g.nodes[v]["op"]
    r = op.out[0]
    t = cp.tensors[r]
    if op.fused_from:
        return None, None, "a packed all_reduce (fuse-collectives bucket)"
    if op.reduce != "sum":
        return None, None, f"reduce={op.reduce}: the fused kernels sum"
    if t.dtype not in FUSED_DTYPES:
        return None, None, f"{t.dtype}: the fused kernels take bf16 or fp16"
    if r in cp.plan.outputs:
        return None, None, f"its result '{r}' is a plan output"
    readers = _readers(g, v, r)
    if len(readers) != 1:
        return None, None, f"its result '{r}' has {len(readers)} readers ({', '.join(readers[:3])}), not one add_rmsnorm"
    n = readers[0]
    norm = g.nodes[n]["op"]
    if n in claimed:
        return None, None, f"add_rmsnorm '{n}' already absorbs its other operand's all_reduce"
    if norm.op != "add_rmsnorm":
        what = "a view" if norm.op in VIEW_OPS else norm.op
        return None, None, f"its result '{r}' feeds {what} '{n}', not an add_rmsnorm"
    if norm.x == norm.residual:
        return None, None, f"add_rmsnorm '{n}' reads '{r}' as both operands"
    if g.nodes[v]["ctx"] != g.nodes[n]["ctx"]:
        return None, None, f"add_rmsnorm '{n}' runs in a different variant context"
    if norm.backend != "auto":
        return None, None, f"add_rmsnorm '{n}' names backend {norm.backend}: left as written"
    target = pin_target(cp.plan, norm, streams)
    if norm.stream and target != pin_target(cp.plan, op, streams):
        if op.stream:  # the fused op runs on one stream: either pin would be broken
            return None, None, (f"add_rmsnorm '{n}' is pinned to {norm.stream}, the all_reduce is"
                                f" {pin_text(op.stream)}: the fused op runs on one stream")
        # only the norm is pinned: the fused op takes its pin, and the reduction moves there with it
        away = _group_elsewhere(cp, v, op.group, target, streams)
        if away:
            more = f" and {len(away) - 3} more" if len(away) > 3 else ""
            return None, None, (f"add_rmsnorm '{n}' is pinned to {norm.stream}, the all_reduce is unpinned, and"
                                f" group {op.group} has {', '.join(away[:3])}{more}: the fused op is a collective"
                                " and every collective of one group runs on one stream (pin the group's"
                                f" collectives to {norm.stream} too, or unpin the norm)")
    other = norm.residual if norm.x == r else norm.x
    og = _reduced_over(cp, other)
    if og is not None and og != op.group:
        return None, None, (f"add_rmsnorm '{n}' adds '{other}', reduced over group {og}, to a sum over {op.group}:"
                            " the fused op reduces one operand over one group")
    for dep in (other, norm.w):
        p = cp.tensors[dep].producer
        if p is not None and p in g and nx.has_path(g, v, p):
            return None, None, f"'{dep}' depends on '{r}' (fusing would make a cycle)"
    return n, other, None


def run(cp: Compiled, cfg) -> tuple[Compiled, bool]:
    g = cp.graph
    plan = cp.plan
    report: dict = {"fused": [], "not_fused": []}
    cp.report[NAME] = report
    ars = [v for v, d in g.nodes(data=True) if d["op"].op == "all_reduce"]
    if not ars:
        return cp, False
    index = {o.id: i for i, o in enumerate(plan.ops)}

    def x_first(v):  # an all_reduce in the norm's x position wins over one in its residual position
        r = g.nodes[v]["op"].out[0]
        rd = _readers(g, v, r)
        pos = 0 if len(rd) == 1 and getattr(g.nodes[rd[0]]["op"], "x", None) == r else 1
        return pos, index.get(v, 1 << 60), v
    cands = sorted(ars, key=x_first)
    ictx = InferCtx(cp.tensors, plan.params, plan.dims, plan.groups, cp.probes)
    streams = stream_pool(cp, cfg.num_streams)
    claimed: set = set()
    for v in cands:
        if v not in g:
            continue
        n, other, why = _refusal(cp, v, claimed, streams)
        if why:
            report["not_fused"].append({"ops": [v], "reason": why})
            continue
        claimed.add(n)
        report["fused"].append(_rewrite(cp, v, n, other, ictx))
    report["not_fused"].sort(key=lambda e: (index.get(e["ops"][0], 1 << 60), e["ops"][0]))
    if claimed:
        rebuild_edges(cp)
    return cp, bool(claimed)


def _rewrite(cp: Compiled, v: str, n: str, other: str, ictx) -> dict:
    g = cp.graph
    ar, norm = g.nodes[v]["op"], g.nodes[n]["op"]
    ctx = g.nodes[n]["ctx"]
    r = ar.out[0]
    fused = AllReduceAddRmsNorm(op="all_reduce_add_rmsnorm", id=n, x=ar.x, residual=other, w=norm.w,
                                group=ar.group, eps=norm.eps, inplace=norm.inplace, out=list(norm.out),
                                fused_from=[v, n], doc=norm.doc, stream=ar.stream or norm.stream)
    g.remove_nodes_from([v, n])
    for name in [r, *norm.out]:
        del cp.tensors[name]
    for spec in fused.infer(ictx):
        spec.producer = fused.id
        cp.tensors[spec.name] = spec
    g.add_node(fused.id, op=fused, ctx=ctx, stream=fused.stream or "main", waits=[], records=[])
    for name in fused.inputs():  # the edges in now, so later candidates see this op as a reader
        p = cp.tensors[name].producer
        if p is not None:
            if g.has_edge(p, fused.id):
                g.edges[p, fused.id]["tensors"].append(name)
            else:
                g.add_edge(p, fused.id, tensors=[name])
    t = cp.tensors[fused.out[0]]
    return {"id": fused.id, "all_reduce": v, "add_rmsnorm": n, "group": ar.group, "dtype": t.dtype,
            "x": ar.x, "residual": other, "removed": r, "stream": fused.stream,
            "why": (f"'{r}' is read only by add_rmsnorm '{n}': one all_reduce + residual + RMSNorm op over"
                    f" '{ar.group}' (FlashInfer's fused kernel where capability and the tuned token limit"
                    " allow, the all_reduce then the norm otherwise)")}


def describe(report, st) -> list[str]:
    """The text report's lines for this pass (`st` styles them)."""
    if report == "disabled":
        return [st.bold("All-reduce + norm fusion") + ": disabled"]
    if not isinstance(report, dict) or not (report["fused"] or report["not_fused"]):
        return []
    L = [st.bold("All-reduce + norm fusion") + f": {len(report['fused'])} fused"]
    for f in report["fused"][:10]:
        L.append(f"  {st.cyan(f['id'])}: all_reduce {f['all_reduce']} + add_rmsnorm {f['add_rmsnorm']}"
                 f" -> all_reduce_add_rmsnorm over '{f['group']}' ({f['dtype']})"
                 + (f" on stream {f['stream']}, the pin it keeps" if f.get("stream") else ""))
    if len(report["fused"]) > 10:
        L.append(f"  ... {len(report['fused']) - 10} more (see --emit json)")
    for nf in report["not_fused"][:10]:
        L.append(st.yellow(f"  not fused: {' + '.join(nf['ops'])}: {nf['reason']}"))
    if len(report["not_fused"]) > 10:
        L.append(f"  ... {len(report['not_fused']) - 10} more not fused (see --emit json)")
    return L
