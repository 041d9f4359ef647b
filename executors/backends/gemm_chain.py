"""gemm_chain (planner/passes/fuse_gemm_chains.py): out = a @ b^T and out2 = out[:, col:col+width] @ b2^T.

  cute   the fused KDA step kernel (executors.cute.kda_fused_step): one launch, the second GEMM
         waits inside the grid for the blocks that produce its input; a call whose M or strides the
         kernel cannot take runs the two GEMMs unfused.
  torch  the two GEMMs, on every device.

The first weight may be prepared in the mma_a layout (executors.weights, bctx.layouts): the fused
kernel then takes that tensor itself as its A-fragment operand (w_swap; swapped mma roles), and
the unfused path multiplies on its tile view.
"""

from __future__ import annotations

import torch

from ..dtypes import torch_dtype
from ..weights import MMA_A, mma_a_matmul
from .registry import register
from .torch_ops import gemm_torch

__all__ = []


def _first_gemm(op, bctx):
    """x @ b^T for the chain's first weight in its prepared layout."""
    dt = torch_dtype(bctx.specs[op.a].dtype)
    if bctx.layouts.get(op.b) == MMA_A:
        return lambda x, w: mma_a_matmul(x, w)
    return lambda x, w: gemm_torch(x, w, dt)


@register("gemm_chain", "torch")
def _chain_torch(op, bctx):
    dt = torch_dtype(bctx.specs[op.a].dtype)
    col, width = op.col, op.width
    first = _first_gemm(op, bctx)

    def run(ins, b, out):
        x, w, w2 = ins
        o = first(x, w)
        return [o, gemm_torch(o[:, col:col + width], w2, dt)]
    return run


def _cute_supports(op, specs, device):
    if device != "cuda":
        return "needs a CUDA device"
    from .. import cute
    if not cute.available():
        return "cutlass DSL not importable or GPU older than sm_90"
    return None


@register("gemm_chain", "cute", supports=_cute_supports)
def _chain_cute(op, bctx):
    from .. import cute
    w_fb = bctx.weights[op.b2]
    nb, kb = w_fb.shape
    fa_col = op.col
    dt = torch_dtype(bctx.specs[op.a].dtype)
    first = _first_gemm(op, bctx)
    prepared = bctx.layouts.get(op.b) == MMA_A  # the plan weight is kept only in the A-fragment layout
    # one workspace per step, made now (not inside a caller's capture); steps never run concurrently with themselves
    ws = cute.new_fused_workspace(bctx.device) if str(bctx.device).startswith("cuda") else None

    def run(ins, b, out):
        x, w, w2 = ins
        m, k = x.shape
        n = w.shape[0]
        ok = x.stride(1) == 1 and w.is_contiguous() and w2 is w_fb and w_fb.is_contiguous()
        why = cute.supports_fused(m, n, k, fa_col, nb, kb, x.dtype, x.stride(0), n) if ok else "strides"
        if why is None and prepared and not cute.default_fused_config(m, n, k, kb, fa_col, True).weights_as_a:
            why = "the mma_a weight needs the swapped-role kernel"  # (not tile-aligned f_a)
        if why is not None:
            o = first(x, w)
            return [o, gemm_torch(o[:, fa_col:fa_col + kb], w2, dt)]
        o = torch.empty((m, n), dtype=x.dtype, device=x.device)
        g1 = torch.empty((m, nb), dtype=x.dtype, device=x.device)
        cute.kda_fused_step(x, w, w_fb, o, g1, fa_col=fa_col, workspace=ws, w_swap=w if prepared else None)
        return [o, g1]
    return run
