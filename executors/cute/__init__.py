"""CuTe DSL skinny bf16 GEMMs for the Kimi-K3 KDA decode projections (H200, sm_90a).

    out[M, N] = x[M, K] @ w[N, K]^T      bf16 in, fp32 accumulate, bf16 out, 1 <= M <= 16

Public API (GPU imports are lazy: importing this package needs neither cutlass nor a GPU):

* ``available()``  cutlass importable and a CUDA device with cc >= 9.0
* ``importable()`` cutlass importable (CPU compile tests)
* ``supports(m, n, k, dtype, x_row_stride, out_row_stride=None)`` -> None or a reason
* ``skinny_gemm(x, w, out=None, config=None)``
* ``configs_for(m, n, k)``, ``default_config(m, n, k)``, ``Config``
* ``compile_for_arch(config, n, k, arch="sm_90a")`` -> PTX text, no GPU needed

Kernels are compiled once per (config, N, K, arch) and cached in process and on disk
(``$PLANNER_CACHE_DIR/cute`` or ``~/.cache/planner/cute``) through ``export_to_c`` /
``load_module``. They are compiled for the TVM-FFI calling convention with an
environment stream, so every call launches on torch's current stream (side streams and
CUDA-graph capture work) with programmatic dependent launch.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from .config import KINDS, MAX_M, Config, configs_for, default_config, kind_for

__all__ = [
    "Config",
    "KINDS",
    "available",
    "importable",
    "supports",
    "skinny_gemm",
    "configs_for",
    "default_config",
    "kind_for",
    "compile_for_arch",
    "get_kernel",
    "cache_dir",
]

_lock = threading.Lock()
_compiled: dict[tuple, Any] = {}
_importable: bool | None = None


def importable() -> bool:
    """True when nvidia-cutlass-dsl can be imported."""
    global _importable
    if _importable is None:
        try:
            import cutlass  # noqa: F401
            import cutlass.cute  # noqa: F401

            _importable = True
        except Exception:
            _importable = False
    return _importable


def available() -> bool:
    """True when the kernels can run here: cutlass importable and a cc >= 9.0 GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        if torch.cuda.get_device_capability() < (9, 0):
            return False
    except Exception:
        return False
    return importable()


def _dtype_is_bf16(dtype) -> bool:
    try:
        import torch

        if dtype is torch.bfloat16:
            return True
    except Exception:
        pass
    return str(dtype) in ("bfloat16", "torch.bfloat16", "bf16")


def supports(m: int, n: int, k: int, dtype, x_row_stride: int,
             out_row_stride: int | None = None) -> str | None:
    """None if ``skinny_gemm`` handles this problem, else a human-readable reason."""
    if not _dtype_is_bf16(dtype):
        return f"dtype {dtype} is not bfloat16"
    if m < 1 or m > MAX_M:
        return f"M={m} outside 1..{MAX_M}"
    if n < 1:
        return f"N={n} must be positive"
    if k < 8 or k % 8:
        return f"K={k} must be a positive multiple of 8"
    if x_row_stride < k:
        return f"x row stride {x_row_stride} < K={k}"
    if x_row_stride % 8:
        return f"x row stride {x_row_stride} not a multiple of 8 elements (16 bytes)"
    if out_row_stride is not None and out_row_stride < n:
        return f"out row stride {out_row_stride} < N={n}"
    cfg = None
    try:
        cfg = default_config(m, n, k)
    except ValueError as e:
        return str(e)
    return cfg.check(m, n, k)


# --------------------------------------------------------------------------------------
# compilation and caching
# --------------------------------------------------------------------------------------
def cache_dir() -> Path:
    base = os.environ.get("PLANNER_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "planner"
    return root / "cute"


def _cutlass_version() -> str:
    try:
        from importlib.metadata import version

        return version("nvidia-cutlass-dsl")
    except Exception:
        return "unknown"


def _source_hash() -> str:
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in ("kernels.py", "config.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()[:12]


def _device_arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"


def _fn_name(cfg: Config, n: int, k: int, arch: str) -> tuple[str, str]:
    tag = f"{cfg.key()}_n{n}_k{k}_{arch}_{_cutlass_version()}_{_source_hash()}"
    return "skinny_" + hashlib.sha256(tag.encode()).hexdigest()[:20], tag


def _compile(cfg: Config, n: int, k: int, arch: str | None, use_disk: bool = True):
    from . import kernels

    arch = arch or _device_arch()
    fname, tag = _fn_name(cfg, n, k, arch)
    path = cache_dir() / f"{fname}.o"
    if use_disk and path.exists():
        try:
            import cutlass.cute as cute

            mod = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
            return getattr(mod, fname)
        except Exception:
            pass  # stale or broken file: recompile
    fn = kernels.compile_tvm_ffi(cfg, n, k, extra_options=f"--gpu-arch {arch}")
    if use_disk:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".o")
            os.close(fd)
            fn.export_to_c(tmp, function_name=fname)
            os.replace(tmp, path)
            (path.parent / f"{fname}.txt").write_text(tag + "\n")
        except Exception:
            pass
    return fn


def get_kernel(cfg: Config, n: int, k: int, arch: str | None = None):
    """Compiled TVM-FFI callable ``fn(x, w, out)`` for this config and shape (cached)."""
    key = (cfg, n, k, arch)
    fn = _compiled.get(key)
    if fn is None:
        with _lock:  # cute.compile is not thread-safe
            fn = _compiled.get(key)
            if fn is None:
                fn = _compile(cfg, n, k, arch)
                _compiled[key] = fn
    return fn


def compile_for_arch(config: Config, n: int, k: int, arch: str = "sm_90a") -> str:
    """Compile without a GPU and return the PTX text."""
    from . import kernels

    with _lock, tempfile.TemporaryDirectory() as d:
        fn = kernels.compile_tvm_ffi(config, n, k,
                                     extra_options=f"--gpu-arch {arch} --keep-ptx --dump-dir {d}")
        ptx = fn.__ptx__
        if ptx and not ptx.lstrip().startswith("//") and ".version" not in ptx:
            p = Path(ptx)
            if p.exists():
                ptx = p.read_text()
        if not ptx:
            files = list(Path(d).glob("*.ptx"))
            ptx = files[0].read_text() if files else ""
    return ptx


# --------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------
def skinny_gemm(x, w, out=None, config: Config | None = None):
    """out[M, N] = x[M, K] @ w[N, K]^T on torch's current stream.

    x may be a strided row view (stride(1) == 1, stride(0) % 8 == 0, 16-byte aligned),
    e.g. f_a read in place from the F_A/beta output. out may be a column slice of a
    wider buffer (stride(1) == 1).
    """
    import torch

    if x.dim() != 2 or w.dim() != 2:
        raise ValueError("x and w must be 2-D")
    m, k = x.shape
    n, kw = w.shape
    if kw != k:
        raise ValueError(f"K mismatch: x {tuple(x.shape)} w {tuple(w.shape)}")
    if x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16:
        raise ValueError("x and w must be bfloat16")
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    elif out.shape != (m, n) or out.dtype != torch.bfloat16:
        raise ValueError(f"out must be bf16 {(m, n)}, got {out.dtype} {tuple(out.shape)}")
    if m == 0:
        return out
    if x.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("x and out need unit stride along the last dim")
    if not w.is_contiguous():
        raise ValueError("w must be contiguous")
    reason = supports(m, n, k, x.dtype, x.stride(0), out.stride(0))
    if reason is not None:
        raise ValueError(f"skinny_gemm unsupported: {reason}")
    if x.data_ptr() % 16 or w.data_ptr() % 16:
        raise ValueError("x and w must be 16-byte aligned")
    cfg = config if config is not None else default_config(m, n, k)
    why = cfg.check(m, n, k)
    if why is not None:
        raise ValueError(f"config {cfg.key()} cannot run M={m} N={n} K={k}: {why}")
    fn = get_kernel(cfg, n, k)
    fn(x, w, out)
    return out
