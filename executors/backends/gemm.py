"""Optional GEMM backends: the CuTe skinny kernels (executors.cute) and FlashInfer mm_bf16.

Both register into the same (op, backend) registry as the torch backend, with
capability checks; nothing GPU-specific is imported until a check or a run needs
it, so CPU machines never import cutlass or flashinfer.

  cute                  executors.cute.skinny_gemm, bf16, M <= 16, sm_90+.
  flashinfer[:sub]      flashinfer.mm_bf16(a, W.t(), backend=sub); on sm_90 the
                        sub-backends cudnn, cublaslt, tinygemm and cutile are
                        eligible (cute-dsl, cutlass need sm_100+). "flashinfer" alone means cudnn on sm_90
                        and cute-dsl on sm_100+. Tune FlashInfer before graph capture.

With backend 'auto', M is only known per call: the runner takes the kernel when it
supports this call's M and strides and torch.mm otherwise (the by-M kernel table
vLLM uses). An op that names its backend explicitly gets that kernel or an error.
"""

from __future__ import annotations

import torch

from ..dtypes import torch_dtype
from .registry import register
from .torch_ops import gemm_torch

__all__ = ["FLASHINFER_SUBS"]

FLASHINFER_SUBS = {"cudnn": 90, "cublaslt": 90, "tinygemm": 90, "cutile": 90, "cute-dsl": 100, "cutlass": 100}


def _static_nk(specs):
    a, w = specs
    n, k = w.shape
    if not isinstance(n, int) or not isinstance(k, int):
        return None, None, f"weight shape {w.shape} is not static"
    if a.dtype != "bf16" or w.dtype != "bf16":
        return None, None, f"needs bf16 operands, got {a.dtype} x {w.dtype}"
    return n, k, None


def _cute_supports(op, specs, device):
    if device != "cuda":
        return "needs a CUDA device"
    if op.out_dtype not in (None, "bf16"):
        return f"out_dtype {op.out_dtype} (bf16 only)"
    n, k, why = _static_nk(specs)
    if why:
        return why
    from .. import cute
    if not cute.available():
        return "cutlass DSL not importable or GPU older than sm_90"
    return cute.supports(1, n, k, torch.bfloat16, k)


@register("gemm", "cute", supports=_cute_supports)
def _cute_gemm(op, bctx):
    from .. import cute
    explicit = op.backend == "cute"
    dt = torch.bfloat16

    def run(ins, b, out):
        a, w = ins
        m, k = a.shape
        n = w.shape[0]
        target = out if out is not None and out.stride(-1) == 1 else None
        why = cute.supports(m, n, k, a.dtype, a.stride(0), None if target is None else target.stride(0))
        if why is None and a.stride(1) == 1:
            r = cute.skinny_gemm(a, w, out=target)
            return r if out is None or r is out else out.copy_(r)
        if explicit:
            raise RuntimeError(f"op '{op.id}': backend cute cannot run M={m} N={n} K={k}: {why}")
        return gemm_torch(a, w, dt, out)
    return run


def _fi_supports(sub):
    def check(op, specs, device):
        if device != "cuda":
            return "needs a CUDA device"
        n, k, why = _static_nk(specs)
        if why:
            return why
        try:
            import flashinfer  # noqa: F401
        except Exception as exc:  # noqa: BLE001
            return f"flashinfer not importable ({type(exc).__name__})"
        major, minor = torch.cuda.get_device_capability()
        cc = major * 10 + minor
        name = sub or ("cudnn" if cc < 100 else "cute-dsl")
        if cc < FLASHINFER_SUBS[name]:
            return f"flashinfer backend {name} needs sm_{FLASHINFER_SUBS[name]}+, this GPU is sm_{cc}"
        return None
    return check


def _fi_make(sub):
    def make(op, bctx):
        from flashinfer import mm_bf16
        major, minor = torch.cuda.get_device_capability()
        name = sub or ("cudnn" if major * 10 + minor < 100 else "cute-dsl")
        dt = torch_dtype(op.out_dtype or "bf16")

        def run(ins, b, out):
            a, w = ins
            target = out if out is not None and out.is_contiguous() else None
            r = mm_bf16(a if a.stride(1) == 1 else a.contiguous(), w.t(), out=target, out_dtype=dt, backend=name)
            return r if out is None or r is out else out.copy_(r)
        return run
    return make


register("gemm", "flashinfer", supports=_fi_supports(None))(_fi_make(None))
for _sub in FLASHINFER_SUBS:
    register("gemm", f"flashinfer:{_sub}", supports=_fi_supports(_sub))(_fi_make(_sub))
# the other optional backends register themselves on import (cute "add", "p2p" all_gather)


def gemm_runner(backend: str, config: dict | None = None, out_dtype=None):
    """fn(a, w, out=None) -> a @ w.T with this backend/config; `out` may be a column slice."""
    dt = out_dtype or torch.bfloat16
    if backend == "torch":
        return lambda a, w, out=None: gemm_torch(a, w, dt, out)
    if backend == "cute":
        from .. import cute
        from ..cute.config import Config, m_tile_for
        base = Config.from_dict(config) if config else None
        per_m: dict = {}

        def run_cute(a, w, out=None):
            m, k = a.shape
            n = w.shape[0]
            cfg = per_m.get((m, n, k))
            if cfg is None:
                cfg = base
                if cfg is None or cfg.check(m, n, k) is not None:
                    cfg = cute.default_config(m, n, k) if base is None else Config.from_dict(
                        {**base.to_dict(), "m_tile": m_tile_for(m, base.kind)})
                    if cfg.check(m, n, k) is not None:
                        cfg = cute.default_config(m, n, k)
                per_m[(m, n, k)] = cfg
            target = out if out is not None and out.stride(-1) == 1 else None
            if a.stride(1) != 1 or cute.supports(m, n, k, a.dtype, a.stride(0),
                                                 None if target is None else target.stride(0)) is not None:
                return gemm_torch(a, w, dt, out)
            r = cute.skinny_gemm(a, w, out=target, config=cfg)
            return r if out is None or r is out else out.copy_(r)
        return run_cute
    if backend.startswith("flashinfer"):
        from flashinfer import mm_bf16
        sub = backend.split(":", 1)[1] if ":" in backend else None
        if sub is None:
            major, minor = torch.cuda.get_device_capability()
            sub = "cudnn" if major * 10 + minor < 100 else "cute-dsl"

        def run_fi(a, w, out=None):
            target = out if out is not None and out.is_contiguous() else None
            r = mm_bf16(a if a.stride(1) == 1 else a.contiguous(), w.t(), out=target, out_dtype=dt, backend=sub)
            return r if out is None or r is out else out.copy_(r)
        return run_fi
    raise ValueError(f"unknown gemm backend '{backend}'")
