"""GEMM-chain peephole: gemm -> split -> gemm on a column slice of the first result.

The KDA packed variant computes proj = x @ W_packed^T, splits it, and then
g1 = f_a @ W_FB^T where f_a is a column slice of proj. The CuTe fused kernel
(executors.cute.kda_fused_step) does both in one launch: the F_B part waits inside
the grid for the blocks that produce f_a. This module finds such chains in the
lowered steps (same stream, same variant guard, f_a a split view of the first
result, the second GEMM's weight a plan weight) and rewires the two steps: the first
runs the fused kernel when this call's M and strides allow it and stashes g1; the
second returns the stash. Otherwise both run their normal implementations, so the
result never depends on whether the kernel applied. Only for backend 'auto' or 'cute'.
"""

from __future__ import annotations

import torch

__all__ = ["fuse_gemm_chains"]


def _chain_of(cp, steps_by_id, st_b):
    """(step A, fa_col) if st_b is the second gemm of a gemm -> split -> gemm chain."""
    g = cp.graph
    op_b = g.nodes[st_b.id]["op"]
    if op_b.scaled:  # the fused KDA kernel is bf16 only
        return None
    fa = cp.tensors.get(op_b.a)
    if fa is None or fa.producer is None or g.nodes[fa.producer]["op"].op != "split":
        return None
    sp = g.nodes[fa.producer]["op"]
    src = cp.tensors[sp.x]
    if src.producer is None or src.producer not in steps_by_id:
        return None
    st_a = steps_by_id[src.producer]
    op_a = g.nodes[st_a.id]["op"]
    widths = [cp.tensors[o].shape[-1] for o in sp.out]
    if op_a.op != "gemm" or op_a.scaled or sp.dim % 2 != 1 or not all(isinstance(w, int) for w in widths):
        return None
    if st_a.stream != st_b.stream or st_a.guard != st_b.guard or st_a.slot is not None:
        return None
    if op_b.b not in cp.plan.weights or op_a.b not in cp.plan.weights:
        return None
    if op_a.backend not in ("cute", "auto") or op_b.backend not in ("cute", "auto"):
        return None
    idx = sp.out.index(op_b.a)
    return st_a, sum(widths[:idx])


def fuse_gemm_chains(cp, steps, weights: dict, device, prefs=None, prepacked: dict | None = None,
                     layouts: dict | None = None) -> list[tuple[str, str]]:
    """Rewire eligible chains in place; returns [(first gemm id, second gemm id)].
    `prefs` (the executor's backend_prefs) without "cute" turns the peephole off. With a
    `prepacked` dict, a chain whose first weight fits keeps that weight a second time in the
    A-fragment layout (swapped mma roles) and records {weight name: bytes} there. With `layouts`
    (executors.weights), a first weight prepared as "mma_a" is itself the kernel's w_swap: no copy."""
    if device.type != "cuda" or (prefs is not None and "cute" not in prefs):
        return []
    from . import cute
    if not cute.available() or not hasattr(cute, "kda_fused_step"):
        return []
    by_id = {s.id: s for s in steps if s.kind == "gemm"}
    done = []
    for st_b in list(by_id.values()):
        found = _chain_of(cp, by_id, st_b)
        if found is None:
            continue
        st_a, fa_col = found
        w_fb = weights[cp.graph.nodes[st_b.id]["op"].b]
        name_a = cp.graph.nodes[st_a.id]["op"].b
        w_a = weights[name_a]
        if layouts is not None and layouts.get(name_a) == "mma_a":
            _rewire(st_a, st_b, w_fb, fa_col, cute, w_prepared=w_a)
            done.append((st_a.id, st_b.id))
            continue
        swappable = (prepacked is not None and w_a.dim() == 2 and w_a.shape[0] % 16 == 0
                     and w_a.shape[1] % 32 == 0 and w_a.is_contiguous())
        _rewire(st_a, st_b, w_fb, fa_col, cute, w_a if swappable else None)
        if swappable:
            prepacked[name_a] = w_a.numel() * w_a.element_size()
        done.append((st_a.id, st_b.id))
    return done


def _rewire(st_a, st_b, w_fb, fa_col, cute, w_a=None, w_prepared=None):
    run_a, run_b = st_a.run, st_b.run
    cell: dict = {}
    nb, kb = w_fb.shape
    # w_a (the first gemm's plan weight) once more in the A-fragment layout, for the kernel with
    # swapped mma roles (run49: 0.3-1.5 us per step), at the cost of a second copy of w_a in
    # device memory. Remade if w_a is written in place (its version counter moves); during a
    # graph capture a stale copy is not used at all.
    swap = {"w": None, "version": None}

    def swapped(w):
        if w_prepared is not None:  # the plan weight is kept only in the A-fragment layout
            return w_prepared if w.data_ptr() == w_prepared.data_ptr() and w.shape == w_prepared.shape else None
        if w_a is None or w.data_ptr() != w_a.data_ptr() or w.shape != w_a.shape:
            return None
        if swap["version"] != w_a._version:
            if torch.cuda.is_current_stream_capturing():
                return None
            swap["w"], swap["version"] = cute.tile_weights(w_a, 2), w_a._version
        return swap["w"]

    if w_a is not None:
        swapped(w_a)  # at build time, not in the first call

    def first(ins, b, out):
        x, w = ins
        m, k = x.shape
        n = w.shape[0]
        ok = x.stride(1) == 1 and w.is_contiguous() and w_fb.is_contiguous()
        target = out if out is not None else None
        why = cute.supports_fused(m, n, k, fa_col, nb, kb, x.dtype, x.stride(0),
                                  n if target is None else target.stride(0)) if ok else "strides"
        if why is None:
            o = target if target is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
            g1 = torch.empty((m, nb), dtype=x.dtype, device=x.device)
            cute.kda_fused_step(x, w, w_fb, o, g1, fa_col=fa_col, w_swap=swapped(w))
            cell["g1"] = g1
            return o
        cell["g1"] = None
        return run_a(ins, b, out)

    def second(ins, b, out):
        g1 = cell.pop("g1", None)
        if g1 is None:
            return run_b(ins, b, out)
        return out.copy_(g1) if out is not None else g1

    st_a.run, st_b.run = first, second
    st_a.backend, st_b.backend = "cute:fused-chain", f"cute:fused-into:{st_a.id}"
