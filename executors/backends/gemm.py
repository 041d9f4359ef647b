"""Optional GEMM backends: the CuTe skinny kernels (executors.cute) and FlashInfer mm_bf16.

Both register into the same (op, backend) registry as the torch backend, with
capability checks; nothing GPU-specific is imported until a check or a run needs
it, so CPU machines never import cutlass or flashinfer.

  cute                  executors.cute.skinny_gemm, bf16, M <= 16, sm_90+.
  flashinfer[:sub]      flashinfer.mm_bf16(a, W.t(), backend=sub); on sm_90 the
                        sub-backends cudnn, cublaslt, tinygemm and cutile are
                        eligible (cute-dsl, cutlass need sm_100+). "flashinfer" alone means cudnn on sm_90
                        and cute-dsl on sm_100+. Tune FlashInfer before graph capture.

Scaled fp8 gemms (gemm(x, w, scale_a=, scale_b=)) have their own kernels under the same names:
  cute                  executors.cute.fp8 (supports_fp8 / gemm_fp8), the decode skinny kernel;
                        imported only once its capability check finds the module.
  flashinfer:fp8_blockscale_sm90   flashinfer.gemm.fp8_blockscale_gemm_sm90 (1x128 x 128x128
                        blocks, e4m3, sm_90 only).
  flashinfer:bmm_fp8    flashinfer.gemm.bmm_fp8 (per-tensor scales, cuBLAS; sm_89+).
  flashinfer:fp8_groupwise  flashinfer.gemm.gemm_fp8_nt_groupwise (blocks; sm_100+).
  flashinfer            the first of those three that can run the op.

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
    if op.scaled:
        return _cute_fp8_supports(op, specs, device)
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
    if op.scaled:
        return _cute_fp8_make(op, bctx)
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
        if sub is None and op.scaled:
            return _fi_fp8_pick(op, specs, device)[1]
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
        if sub is None and op.scaled:
            name, _ = _fi_fp8_pick(op, [bctx.specs[n] for n in op.inputs()], "cuda")
            return FP8_FLASHINFER[name][1](op, bctx)
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


# ---------------------------------------------------------------- scaled fp8 gemms

def _fp8_kinds(op, specs):
    from .torch_fp8 import kinds_of
    return kinds_of(op, specs)


def _cute_fp8_supports(op, specs, device):
    import importlib.util
    if importlib.util.find_spec("executors.cute.fp8") is None:
        return "executors.cute.fp8 (the CuTe fp8 skinny GEMM) is not in this tree"
    from .. import cute
    if not cute.available():
        return "cutlass DSL not importable or GPU older than sm_90"
    a, w = specs[:2]
    n, k = w.shape
    if not isinstance(n, int) or not isinstance(k, int):
        return f"weight shape {w.shape} is not static"
    if (op.out_dtype or "bf16") != "bf16":
        return f"out_dtype {op.out_dtype} (bf16 only)"
    from ..cute import fp8 as cute_fp8
    ka, kb = _fp8_kinds(op, specs)
    return cute_fp8.supports_fp8(1, n, k, ka, kb, torch.device("cuda"))


def _cute_fp8_make(op, bctx):
    from ..cute import fp8 as cute_fp8
    from .torch_fp8 import make_gemm_fp8
    specs = [bctx.specs[n] for n in op.inputs()]
    ka, kb = _fp8_kinds(op, specs)
    fallback = make_gemm_fp8(op, specs)
    explicit = op.backend == "cute"

    def run(ins, b, out):
        a, w, sa, sb = ins
        m, k = a.shape
        why = cute_fp8.supports_fp8(m, w.shape[0], k, ka, kb, a.device)
        if why is None:
            target = out if out is not None and out.stride(-1) == 1 else None
            r = cute_fp8.gemm_fp8(a, w, sa, sb, out=target, out_dtype=torch.bfloat16)
            return r if out is None or r is out else out.copy_(r)
        if explicit:
            raise RuntimeError(f"op '{op.id}': backend cute cannot run this fp8 gemm (M={m}): {why}")
        return fallback(ins, b, out)
    return run


def _fi_fp8_check(kinds_ok, min_cc, max_cc=None, e4m3_only=True):
    def check(op, specs, device):
        if device != "cuda":
            return "needs a CUDA device"
        if not op.scaled:
            return "for scaled fp8 gemms only"
        import importlib.util
        if importlib.util.find_spec("flashinfer") is None:
            return "flashinfer is not installed"
        a, w = specs[:2]
        if e4m3_only and (a.dtype, w.dtype) != ("fp8_e4m3", "fp8_e4m3"):
            return f"needs e4m3 operands, got {a.dtype} x {w.dtype}"
        kinds = _fp8_kinds(op, specs)
        if kinds not in kinds_ok:
            return f"scale kinds {kinds[0]} x {kinds[1]} (takes {', '.join('x'.join(k) for k in kinds_ok)})"
        n, k = w.shape
        if kinds == ("block", "block") and not (isinstance(n, int) and isinstance(k, int) and n % 128 == 0
                                                and k % 128 == 0):
            return f"block kernels need N and K multiples of 128 (N={n}, K={k})"
        if (op.out_dtype or "bf16") != "bf16":
            return f"out_dtype {op.out_dtype} (bf16 only)"
        major, minor = torch.cuda.get_device_capability()
        cc = major * 10 + minor
        if cc < min_cc or (max_cc is not None and cc > max_cc):
            return f"needs sm_{min_cc}" + ("" if max_cc == min_cc else "+") + f", this GPU is sm_{cc}"
        return None
    return check


def fp8_kernel(name: str):
    """fn(a, w, sa, sb, out=None) -> bf16 a @ w.T with FlashInfer fp8 kernel `name`."""
    if name == "fp8_blockscale_sm90":
        from flashinfer.gemm import fp8_blockscale_gemm_sm90

        def blockscale(a, w, sa, sb, out=None):
            return fp8_blockscale_gemm_sm90(a, w, sa, sb, out=out, out_dtype=torch.bfloat16)
        return blockscale
    if name == "bmm_fp8":
        from flashinfer.gemm import bmm_fp8

        def bmm(a, w, sa, sb, out=None):
            r = bmm_fp8(a.unsqueeze(0), w.t().unsqueeze(0), sa.reshape(()), sb.reshape(()), torch.bfloat16,
                        out=None if out is None else out.unsqueeze(0), backend="cublas")
            return r.squeeze(0)
        return bmm
    from flashinfer.gemm import gemm_fp8_nt_groupwise

    def groupwise(a, w, sa, sb, out=None):  # K-major scales: a [M, K/128], b [N/128, K/128]
        return gemm_fp8_nt_groupwise(a, w, sa, sb, scale_major_mode="K", out=out, out_dtype=torch.bfloat16)
    return groupwise


def _fi_fp8_make(name):
    def make(op, bctx):
        fn = fp8_kernel(name)

        def run(ins, b, out):
            a, w, sa, sb = ins
            a = a if a.stride(1) == 1 and a.is_contiguous() else a.contiguous()
            dst = out if out is not None and out.is_contiguous() else None
            r = fn(a, w, sa, sb, out=dst)
            return r if out is None or r is out else out.copy_(r)
        return run
    return make


_BLOCK = {("block", "block")}
FP8_FLASHINFER = {
    "fp8_blockscale_sm90": (_fi_fp8_check(_BLOCK, 90, 90), _fi_fp8_make("fp8_blockscale_sm90")),
    "bmm_fp8": (_fi_fp8_check({("tensor", "tensor")}, 89, e4m3_only=False), _fi_fp8_make("bmm_fp8")),
    "fp8_groupwise": (_fi_fp8_check(_BLOCK, 100), _fi_fp8_make("fp8_groupwise")),
}
for _name, (_check, _make) in FP8_FLASHINFER.items():
    register("gemm", f"flashinfer:{_name}", supports=_check)(_make)


def _fi_fp8_pick(op, specs, device):
    """(name, None) of the first FlashInfer fp8 kernel that runs op, else (None, every reason)."""
    reasons = []
    for name, (check, _) in FP8_FLASHINFER.items():
        why = check(op, specs, device)
        if why is None:
            return name, None
        reasons.append(f"{name}: {why}")
    return None, "; ".join(reasons)


def gemm_fp8_runner(backend: str, op_kinds: tuple, out_dtype=None):
    """fn(a, w, sa, sb, out=None) for a scaled fp8 gemm with this backend (tune and benches)."""
    ka, kb = op_kinds
    dt = out_dtype or torch.bfloat16
    if backend == "torch":
        from .torch_fp8 import _scaled_mm_fits, gemm_fp8_reference, gemm_fp8_scaled_mm

        def run_torch(a, w, sa, sb, out=None):
            if _scaled_mm_fits(a, w, ka, kb):
                r = gemm_fp8_scaled_mm(a, w, sa, sb, ka, kb, dt)
                return r if out is None else out.copy_(r)
            return gemm_fp8_reference(a, w, sa, sb, ka, kb, dt, out)
        return run_torch
    if backend == "cute":
        from ..cute import fp8 as cute_fp8
        return lambda a, w, sa, sb, out=None: cute_fp8.gemm_fp8(a, w, sa, sb, out=out, out_dtype=dt)
    if backend.startswith("flashinfer:"):
        return fp8_kernel(backend.split(":", 1)[1])
    raise ValueError(f"unknown fp8 gemm backend '{backend}'")


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
