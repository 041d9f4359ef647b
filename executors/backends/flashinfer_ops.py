"""FlashInfer kernels for the memory-bound ops: flashinfer.norm (rmsnorm, fused_add_rmsnorm),
flashinfer.activation (silu_and_mul, gelu_and_mul, gelu_tanh_and_mul), flashinfer.rope
(apply_rope_with_cos_sin_cache) and flashinfer.quantization.per_token_group_quant_8bit.

Opt-in like the FlashInfer GEMMs (the registry's default priority is cute, p2p, torch):
an op's `backend: flashinfer`, backend_prefs, or a `planner tune` file that measured it
faster than torch picks it. Capability (build time): a CUDA device, sm_80+, flashinfer
importable, dtypes it has kernels for. Per call the runner takes the kernel when the
tensors fit (contiguous rows) and the torch implementation otherwise; an op that names
flashinfer explicitly gets the kernel or an error.
"""

from __future__ import annotations

import torch

from ..dtypes import torch_dtype
from .registry import register
from .torch_fp8 import quantize_reference
from .torch_pointwise import add_rmsnorm_ref, gated_ref, rmsnorm_ref, rope_ref

__all__ = ["flashinfer_reason"]


def flashinfer_reason(device: str, min_cc: int = 80) -> str | None:
    """None when FlashInfer can run here, else why not."""
    if device != "cuda":
        return "needs a CUDA device"
    import importlib.util
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer is not installed"
    major, minor = torch.cuda.get_device_capability()
    if major * 10 + minor < min_cc:
        return f"needs sm_{min_cc}+, this GPU is sm_{major}{minor}"
    return None


def _supports(dtypes=("bf16", "fp16")):
    def check(op, specs, device):
        if specs[0].dtype not in dtypes:
            return f"needs {' or '.join(dtypes)} input, got {specs[0].dtype}"
        return flashinfer_reason(device)
    return check


def _rows(x):
    """x as [rows, width] without a copy, or None when its rows are not contiguous."""
    if x.stride(-1) != 1 or not x.is_contiguous():
        return None
    return x.reshape(-1, x.shape[-1])


def _explicit(op):
    return getattr(op, "backend", "auto") == "flashinfer"


def _cannot(op, what):
    raise RuntimeError(f"op '{op.id}': backend flashinfer cannot run this {op.op}: {what}")


@register("rmsnorm", "flashinfer", supports=_supports())
def _fi_rmsnorm(op, bctx):
    from flashinfer.norm import rmsnorm
    eps, explicit = op.eps, _explicit(op)

    def run(ins, b, out):
        x, w = ins
        x2 = _rows(x)
        if x2 is None:
            if explicit:
                _cannot(op, "input rows are not contiguous")
            return rmsnorm_ref(x, w, eps, out)
        dst = out if out is not None and out.is_contiguous() else None
        r = rmsnorm(x2, w, eps, out=None if dst is None else dst.view(x2.shape)).view(x.shape)
        return r if out is None or dst is not None else out.copy_(r)
    return run


@register("add_rmsnorm", "flashinfer", supports=_supports())
def _fi_add_rmsnorm(op, bctx):
    from flashinfer.norm import fused_add_rmsnorm
    eps, inplace, explicit = op.eps, op.inplace, _explicit(op)

    def run(ins, b, out):
        x, res, w = ins
        if _rows(x) is None or _rows(res) is None:
            if explicit:
                _cannot(op, "input rows are not contiguous")
            return add_rmsnorm_ref(x, res, w, eps, inplace)
        if not inplace:  # the kernel overwrites both: give it copies
            x, res = x.clone(), res.clone()
        fused_add_rmsnorm(x.view(-1, x.shape[-1]), res.view(-1, res.shape[-1]), w, eps)
        return [x, res]
    return run


def _fi_gated(kind):
    def make(op, bctx):
        from flashinfer import activation
        approx = getattr(op, "approximate", "none")
        name = "silu_and_mul" if kind == "silu" else ("gelu_tanh_and_mul" if approx == "tanh" else "gelu_and_mul")
        fn, explicit = getattr(activation, name), _explicit(op)

        def run(ins, b, out):
            x = ins[0]
            if x.stride(-1) != 1:
                if explicit:
                    _cannot(op, "the last dim is strided")
                return gated_ref(x, kind, approx, out)
            dst = out if out is not None and out.is_contiguous() else None
            r = fn(x, out=dst)
            return r if out is None or dst is not None else out.copy_(r)
        return run
    return make


register("silu_and_mul", "flashinfer", supports=_supports())(_fi_gated("silu"))
register("gelu_and_mul", "flashinfer", supports=_supports())(_fi_gated("gelu"))


@register("rope", "flashinfer", supports=_supports())
def _fi_rope(op, bctx):
    from flashinfer.rope import apply_rope_with_cos_sin_cache
    il, explicit = op.interleave, _explicit(op)

    def run(ins, b, out):
        q, k, pos, cache = ins
        d = q.shape[-1]
        if not (q.is_contiguous() and k.is_contiguous()):
            if explicit:
                _cannot(op, "q and k must be contiguous (rope on a strided slice: copy it first)")
            return rope_ref(q, k, pos, cache, il)
        qo, ko = apply_rope_with_cos_sin_cache(pos, q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1), d,
                                               cache, is_neox=not il)
        return [qo.view(q.shape), ko.view(k.shape)]
    return run


def _quant_supports(op, specs, device):
    if op.dtype != "fp8_e4m3":
        return f"per_token_group_quant_8bit makes e4m3 only, not {op.dtype}"
    if specs[0].dtype not in ("bf16", "fp16"):
        return f"needs bf16 or fp16 input, got {specs[0].dtype}"
    if op.block[1] != 128:  # the native CUDA kernel's one group size (the cutile one needs cuda.tile at run time)
        return f"the native kernel takes groups of 128, not {op.block[1]}"
    return flashinfer_reason(device, 90)


@register("quantize", "flashinfer", supports=_quant_supports)
def _fi_quantize(op, bctx):
    from flashinfer.quantization import per_token_group_quant_8bit
    g, dt = op.block[1], torch_dtype(op.dtype)

    def run(ins, b, out):
        x = ins[0]
        if not x.is_contiguous():
            return list(quantize_reference(x, dt, g))
        q, s = per_token_group_quant_8bit(x, g, dst_dtype=dt, backend="cuda")
        return [q, s.contiguous()]  # row-major scales, as the plan declares them
    return run
