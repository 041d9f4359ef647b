"""The torch backend's norms, gated activations, mul and rotary embeddings (CPU and GPU).

Each computes in fp32 and rounds once to the input dtype, as FlashInfer's kernels do, so
the two agree to one rounding. add_rmsnorm with inplace writes its results over its inputs
(the planner checked that nothing else reads them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .registry import register
from .torch_ops import binary

__all__ = ["rmsnorm_ref", "add_rmsnorm_ref", "gated_ref", "rope_ref"]


def _rms(xf, w, eps):
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def rmsnorm_ref(x, w, eps, out=None):
    r = _rms(x.float(), w, eps).to(x.dtype)
    return r if out is None else out.copy_(r)


def add_rmsnorm_ref(x, residual, w, eps, inplace=False):
    s = x.float() + residual.float()
    normed = _rms(s, w, eps).to(x.dtype)
    if inplace:
        residual.copy_(s)
        x.copy_(normed)
        return [x, residual]
    return [normed, s.to(x.dtype)]


def gated_ref(x, act: str, approximate: str = "none", out=None):
    d = x.shape[-1] // 2
    g, u = x[..., :d].float(), x[..., d:].float()
    a = F.silu(g) if act == "silu" else F.gelu(g, approximate=approximate)
    r = (a * u).to(x.dtype)
    return r if out is None else out.copy_(r)


def rope_ref(q, k, positions, cache, interleave: bool):
    d = q.shape[-1]
    cs = cache.index_select(0, positions.long()).float()
    cos, sin = cs[:, : d // 2], cs[:, d // 2:]

    def rot(x):
        xf = x.float()
        c, s = (cos.unsqueeze(1), sin.unsqueeze(1)) if x.dim() == 3 else (cos, sin)
        if interleave:
            x1, x2 = xf[..., 0::2], xf[..., 1::2]
            return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), -1).flatten(-2).to(x.dtype)
        x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1).to(x.dtype)
    return [rot(q), rot(k)]


@register("rmsnorm", "torch")
def _rmsnorm(op, bctx):
    eps = op.eps
    return lambda ins, b, out: rmsnorm_ref(ins[0], ins[1], eps, out)


@register("add_rmsnorm", "torch")
def _add_rmsnorm(op, bctx):
    eps, inplace = op.eps, op.inplace
    return lambda ins, b, out: add_rmsnorm_ref(ins[0], ins[1], ins[2], eps, inplace)


@register("silu_and_mul", "torch")
def _silu_and_mul(op, bctx):
    return lambda ins, b, out: gated_ref(ins[0], "silu", out=out)


@register("gelu_and_mul", "torch")
def _gelu_and_mul(op, bctx):
    approx = op.approximate
    return lambda ins, b, out: gated_ref(ins[0], "gelu", approx, out=out)


@register("mul", "torch")
def _mul(op, bctx):
    return binary(torch.mul)


@register("rope", "torch")
def _rope(op, bctx):
    il = op.interleave
    name = op.inputs()[2]

    def run(ins, b, out):
        pos, cache = ins[2], ins[3]
        if pos.device.type == "cpu" and pos.numel():  # on a GPU this check would sync every call
            lo, hi = int(pos.min()), int(pos.max())
            if lo < 0 or hi >= cache.shape[0]:
                raise IndexError(f"rope '{op.id}': positions '{name}' hold {lo}..{hi}, outside the cos/sin cache's"
                                 f" rows 0..{cache.shape[0] - 1}")
        return rope_ref(ins[0], ins[1], pos, cache, il)
    return run
