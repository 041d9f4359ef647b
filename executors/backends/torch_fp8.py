"""The torch backend's fp8 ops: scaled gemms and the activation quantize.

Scaled gemm: torch._scaled_mm (dequantize-free, fp32 accumulation) where it runs -- a CUDA
device, e4m3/e5m2 operands, a row-major a and K, N multiples of 16, per-tensor or
row/column scales, and 1x128 / 128x128 block scales where this torch has them (checked once
per op on the first call); everywhere else (CPU included) the reference: dequantize both
operands to fp32 and matmul. The reference is also what `planner run --check` compares with.
"""

from __future__ import annotations

import torch

from planner.ops_fp8 import BLOCK, FP8_MAX, pair_kinds

from ..dtypes import torch_dtype
from .registry import register

__all__ = ["dequantize", "gemm_fp8_reference", "gemm_fp8_scaled_mm", "quantize_reference", "kinds_of"]


def kinds_of(op, specs) -> tuple[str, str]:
    """The (a, b) scale kinds of a scaled gemm from its input specs (validated at load)."""
    a, b, sa, sb = specs[:4]
    return pair_kinds(a.shape, b.shape, sa.shape, sb.shape)


def dequantize(q, scale, kind: str):
    """fp32 values of an fp8 operand [rows, K] with scales of `kind` (planner/ops_fp8.py)."""
    x = q.float()
    s = scale.float()
    if kind == "tensor":
        return x * s.reshape(())
    rows, k = x.shape
    if kind in ("row", "col") or (kind == "block" and tuple(s.shape) == (rows, 1) and k <= BLOCK):
        return x * s.reshape(-1, 1)
    s = s.repeat_interleave(BLOCK, dim=1)[:, :k]
    if s.shape[0] != rows:  # 128x128 weight blocks: expand the rows too
        s = s.repeat_interleave(BLOCK, dim=0)[:rows]
    return x * s


def gemm_fp8_reference(a, b, sa, sb, ka: str, kb: str, out_dtype, out=None):
    r = (dequantize(a, sa, ka) @ dequantize(b, sb, kb).t()).to(out_dtype)
    return r if out is None else out.copy_(r)


def _scaled_mm_fits(a, b, ka, kb) -> bool:
    m, k = a.shape
    n = b.shape[0]
    return (a.is_cuda and a.stride(1) == 1 and a.stride(0) % 16 == 0 and b.stride(1) == 1
            and k % 16 == 0 and n % 16 == 0 and (ka, kb) in (("tensor", "tensor"), ("row", "col"), ("block", "block")))


def gemm_fp8_scaled_mm(a, b, sa, sb, ka: str, kb: str, out_dtype):
    """torch._scaled_mm with the scale layouts it expects for each kind."""
    if ka == "tensor":
        return torch._scaled_mm(a, b.t(), sa.reshape(()), sb.reshape(()), out_dtype=out_dtype)
    if ka == "row":
        return torch._scaled_mm(a, b.t(), sa.reshape(-1, 1), sb.reshape(1, -1), out_dtype=out_dtype)
    # blockwise (torch >= 2.8 on sm_90): a's 1x128 scales outer-dim-major; b is passed transposed,
    # so its 128x128 scales go as sb.t() (torch checks that scale_b.t() is the [N/128, K/128] tensor)
    return torch._scaled_mm(a, b.t(), sa.t().contiguous().t(), sb.t(), out_dtype=out_dtype)


def make_gemm_fp8(op, specs):
    ka, kb = kinds_of(op, specs)
    dt = torch_dtype(op.out_dtype or "bf16")
    state = {"scaled_mm": True}

    def run(ins, b, out):
        a, w, sa, sb = ins
        if state["scaled_mm"] and _scaled_mm_fits(a, w, ka, kb):
            try:
                r = gemm_fp8_scaled_mm(a, w, sa, sb, ka, kb, dt)
                return r if out is None else out.copy_(r)
            except RuntimeError:  # this torch/GPU lacks the layout: the reference from now on
                state["scaled_mm"] = False
        return gemm_fp8_reference(a, w, sa, sb, ka, kb, dt, out)
    run.kinds = (ka, kb)
    return run


# ---------------------------------------------------------------- quantize

def quantize_reference(x, dtype, group: int, eps: float = 1e-10):
    """(q, scales): per-row groups of `group` along the last dim; scale = amax / fp8 max."""
    fmax = FP8_MAX["fp8_e4m3" if dtype == torch.float8_e4m3fn else "fp8_e5m2"]
    m, k = x.shape
    xf = x.float().reshape(m, k // group, group)
    s = xf.abs().amax(-1).clamp_min(eps) / fmax
    q = (xf / s.unsqueeze(-1)).clamp(-fmax, fmax).to(dtype).reshape(m, k)
    return q, s


@register("quantize", "torch")
def _quantize(op, bctx):
    dt, g = torch_dtype(op.dtype), op.block[1]
    return lambda ins, b, out: list(quantize_reference(ins[0], dt, g))


def _inductor_supports(op, specs, device):
    if device != "cuda":
        return "needs a CUDA device (torch.compile emits Triton kernels)"
    import importlib.util
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    return None


@register("quantize", "inductor", supports=_inductor_supports)
def _quantize_inductor(op, bctx):
    # one fused Triton kernel (amax, divide, cast) instead of torch's five passes; compiled
    # once per shape class (dynamic M), before any graph capture (the tuner warms it up)
    dt, g = torch_dtype(op.dtype), op.block[1]
    fn = torch.compile(lambda x: quantize_reference(x, dt, g), dynamic=True, fullgraph=True)
    return lambda ins, b, out: list(fn(ins[0]))
