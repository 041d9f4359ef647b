"""fuse-gemm-chains: gemm -> split/slice -> gemm on a column range of the first result, as one op.

The KDA packed projection computes proj = x @ W^T, splits it, and g1 = f_a @ W_FB^T where f_a
is a column range of proj. A fused kernel can run both GEMMs in one launch (its second part waits
inside the grid for the blocks that produce f_a), so the pass replaces the two gemms by one
`gemm_chain` op with outputs [proj, g1]; the split (or slice) stays and still reads proj.

Pre: dce ran; before fuse-collectives (which may let a gemm write into a packed slot) and
assign-streams. Post: every chain that meets the static rules below is one gemm_chain op that
keeps the first gemm's id; its `fused_from` names both gemms. Rules (what can be decided without a
device; the device and this call's M are the lowering's and the kernel's to check, and they fall
back to running the two GEMMs):
  - both gemms read plan weights as b, have backend auto or cute, no out_dtype, the same variant
    context and the same stream pin;
  - the second gemm's a is a piece of a split (or a slice) of the first gemm's output along the
    last dim, at a static column `col`;
  - bf16 operands, static N and K with K % 32 == 0, col % 8 == 0, and the piece's width a multiple
    of 32 between 32 and 512 (the fused kernel's register budget for the second GEMM's weights).
"""

from __future__ import annotations

import dataclasses

from ..graph import Compiled, rebuild_edges
from ..infer import InferCtx
from ..ops import GemmChain
from .assign_streams import pin_target, pin_text, stream_pool

NAME = "fuse-gemm-chains"
MAX_WIDTH = 512

__all__ = ["run", "NAME", "find_chains", "describe"]


def _static(*dims) -> bool:
    return all(isinstance(d, int) for d in dims)


def _piece(cp: Compiled, name: str):
    """(source tensor, first column, width) when `name` is a last-dim piece of a static split or
    slice, else None."""
    t = cp.tensors.get(name)
    if t is None or t.producer is None:
        return None
    op = cp.graph.nodes[t.producer]["op"]
    if op.op not in ("split", "slice"):
        return None
    src = cp.tensors[op.x]
    if src.rank != 2 or op.dim % 2 != 1:
        return None
    if op.op == "slice":
        start, width = op.start, t.shape[1]
        return (op.x, start, width) if _static(start, width) else None
    widths = [cp.tensors[o].shape[-1] if o in cp.tensors else None for o in op.out]
    idx = op.out.index(name)
    if not _static(*widths[:idx + 1]):
        return None
    return op.x, sum(widths[:idx]), widths[idx]


def _why_not(cp: Compiled, first, second, col: int, width: int, streams: list[str]) -> str | None:
    g, plan = cp.graph, cp.plan
    for op in (first, second):
        if op.scaled:
            return f"'{op.id}' is a scaled gemm (the fused kernel runs bf16 only)"
        if op.b not in plan.weights:
            return f"'{op.id}' reads '{op.b}', not a plan weight"
        if op.backend not in ("auto", "cute"):
            return f"'{op.id}' asks for backend {op.backend}"
        if op.out_dtype is not None:
            return f"'{op.id}' casts its output to {op.out_dtype}"
    if g.nodes[first.id]["ctx"] != g.nodes[second.id]["ctx"]:
        return "the two gemms run under different variants"
    if pin_target(plan, first, streams) != pin_target(plan, second, streams):  # the gemm_chain runs on one stream
        return (f"the two gemms' pins differ ('{first.id}' {pin_text(first.stream)}, '{second.id}'"
                f" {pin_text(second.stream)}): the fused op runs on one stream")
    a, w, w2 = cp.tensors[first.a], cp.tensors[first.b], cp.tensors[second.b]
    if {a.dtype, w.dtype, w2.dtype} != {"bf16"}:
        return "the fused kernel runs bf16 operands only"
    n, k = w.shape
    if not _static(n, k, *w2.shape):
        return "weight shapes are not static"
    if k % 32:
        return f"K={k} is not a multiple of 32"
    if col % 8 or width % 32 or not 32 <= width <= MAX_WIDTH or col + width > n:
        return (f"columns [{col}, {col + width}) of N={n}: need col % 8 == 0 and a width of 32..{MAX_WIDTH} "
                "in steps of 32")
    return None


def find_chains(cp: Compiled, streams: list[str]) -> tuple[list[tuple[str, str, int, int]], list[dict]]:
    """([(first gemm, second gemm, col, width)], [{"ops", "reason"} of chains left alone]); streams:
    the pool the compile runs on, where pins land."""
    g = cp.graph
    found, skipped = [], []
    taken: set[str] = set()
    for v in list(g.nodes):
        second = g.nodes[v]["op"]
        if second.op != "gemm":
            continue
        piece = _piece(cp, second.a)
        if piece is None:
            continue
        src, col, width = piece
        p = cp.tensors[src].producer
        if p is None or g.nodes[p]["op"].op != "gemm":
            continue
        first = g.nodes[p]["op"]
        why = _why_not(cp, first, second, col, width, streams)
        if why is None and (first.id in taken or second.id in taken):
            why = "one of the gemms is already part of another chain"
        if why is not None:
            skipped.append({"ops": [first.id, second.id], "reason": why})
            continue
        taken |= {first.id, second.id}
        found.append((first.id, second.id, col, width))
    return found, skipped


def run(cp: Compiled, cfg) -> tuple[Compiled, bool]:
    chains, skipped = find_chains(cp, stream_pool(cp, cfg.num_streams))
    g, plan = cp.graph, cp.plan
    ictx = InferCtx(cp.tensors, plan.params, plan.dims, plan.groups, cp.probes)
    fused = []
    for a_id, b_id, col, width in chains:
        first, second = g.nodes[a_id]["op"], g.nodes[b_id]["op"]
        op = GemmChain(op="gemm_chain", id=a_id, a=first.a, b=first.b, b2=second.b, col=col, width=width,
                       out=[first.out[0], second.out[0]], stream=first.stream, doc=first.doc,
                       backend="cute" if "cute" in (first.backend, second.backend) else "auto",
                       fused_from=[a_id, b_id])
        op.infer(ictx)  # the fused op's own checks; the output specs are the gemms' (unchanged)
        ctx = g.nodes[a_id]["ctx"]
        g.remove_node(b_id)
        g.nodes[a_id]["op"] = op
        g.nodes[a_id]["ctx"] = ctx
        # a new spec: the loaded plan's specs are shared with every compile of it
        cp.tensors[second.out[0]] = dataclasses.replace(cp.tensors[second.out[0]], producer=a_id)
        fused.append({"id": a_id, "fused_from": [a_id, b_id], "col": col, "width": width, "stream": op.stream})
    if fused:
        rebuild_edges(cp)
    cp.report[NAME] = {"fused": fused, "not_fused": skipped}
    return cp, bool(fused)


def describe(report, st) -> list[str]:
    """The text report's lines for this pass (`st` styles them): each chain fused or left alone."""
    if report == "disabled":
        return [st.bold("GEMM chain fusion") + ": disabled"]
    if not isinstance(report, dict) or not (report["fused"] or report["not_fused"]):
        return []
    L = [st.bold("GEMM chain fusion") + f": {len(report['fused'])} fused"]
    for f in report["fused"][:10]:
        L.append(f"  {st.cyan(f['id'])}: {' + '.join(f['fused_from'])} -> gemm_chain on columns"
                 f" [{f['col']}, {f['col'] + f['width']})"
                 + (f" on stream {f['stream']}, the pin it keeps" if f.get("stream") else ""))
    for nf in report["not_fused"][:10]:
        L.append(st.yellow(f"  not fused: {nf['ops'][0]} + {nf['ops'][1]}: {nf['reason']}"))
    if len(report["fused"]) + len(report["not_fused"]) > 20:
        L.append("  ... more (see --emit json)")
    return L
