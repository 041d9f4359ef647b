"""CuTe DSL skinny bf16 GEMMs for the Kimi-K3 KDA decode projections (H200, sm_90a).

    out[M, N] = x[M, K] @ w[N, K]^T      bf16 in, fp32 accumulate, bf16 out, 1 <= M <= 16

Public API (GPU imports are lazy: importing this package needs neither cutlass nor a GPU):

* ``available()``  cutlass importable and a CUDA device with cc >= 9.0
* ``importable()`` cutlass importable (CPU compile tests)
* ``supports(m, n, k, dtype, x_row_stride, out_row_stride=None)`` -> None or a reason
* ``skinny_gemm(x, w, out=None, config=None)``
* ``configs_for(m, n, k)``, ``default_config(m, n, k)``, ``Config``
* ``compile_for_arch(config, n, k, arch="sm_90a")`` -> PTX text, no GPU needed
* ``kda_fused_step(x, w_packed, w_fb, out, g1, fa_col=6144, config=None, workspace=None)``
  and ``supports_fused(m, n, k, fa_col, nb, kb, dtype, x_row_stride, out_row_stride)``
  (whole KDA step in ONE kernel, see below), ``default_fused_config``,
  ``compile_fused_for_arch``

Fused KDA decode step (``kda_fused_step``), one launch, PDL-enabled::

    out[M, N]  = x[M, K] @ w_packed[N, K]^T                  (N = 6288 for Kimi-K3:
                 columns 0:6144 = q|k|v|g, 6144:6272 = f_a, 6272:6288 = beta)
    g1[M, NB]  = out[:, fa_col:fa_col+KB] @ w_fb[NB, KB]^T     (NB = 1536, KB = 128: F_B
                 applied to f_a, read back from ``out`` inside the same kernel)

bf16 in/out, fp32 accumulation. ``out`` may be a strided row view (row stride % 8 == 0,
16-byte aligned); ``g1`` any unit-stride row view. The blocks that produce out[:,
fa_col:fa_col+KB] run first and publish it through a global int32 counter; the last
blocks of the grid compute g1 once the counter says f_a is complete (``tagged_handoff``:
once the f_a values they spin on carry this launch's tag). The ``workspace`` (int32,
``fused_workspace_words(config, ...)`` words, zeroed once: counter, the tag epoch's arrival
word, timeline records, tagged f_a) needs no reset between launches (the counter resets itself, the
arrival word only grows), so CUDA-graph replays need no memset; by default one workspace per
(device, stream) is kept here. Two launches that share a workspace must not run concurrently
(same stream is fine).
When f_a's columns are not tile-aligned (no tagged handoff), M > FUSED_MAX_M (8) and no
explicit ``config``, ``kda_fused_step`` computes the same outputs with TWO launches
(``skinny_gemm`` over the packed weight, then F_B on the f_a view of ``out``, PDL-chained):
the counter-handoff fused kernel with m_tile 16 measured 2-3 us slower on the H200. With the
tagged handoff (the Kimi-K3 f_a columns) the fused kernel runs at every M <= 16
(``fused_is_default``, FUSED_TAG_MAX_M). ``workspace`` is unused on the two-launch path.
Split views for the caller: q|k|v|g = out[:, :6144], f_a = out[:, 6144:6272],
beta = out[:, 6272:6288].

Kernels are compiled once per (config, N, K, arch) and cached in process and on disk
(``$PLANNER_CACHE_DIR/cute`` or ``~/.cache/planner/cute``) through ``export_to_c`` /
``load_module``. They are compiled for the TVM-FFI calling convention with an
environment stream, so every call launches on torch's current stream (side streams and
CUDA-graph capture work) with programmatic dependent launch.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import tempfile
import threading
import tokenize
from pathlib import Path
from typing import Any

from .config import (
    KINDS,
    MAX_M,
    Config,
    check_fused,
    configs_for,
    fused_workspace_words,
    kind_for,
)
from .defaults import (
    FUSED_MAX_M,
    FUSED_TAG_MAX_M,
    default_config,
    default_fused_config,
    fused_is_default,
)

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
    "kda_fused_step",
    "new_fused_workspace",
    "supports_fused",
    "default_fused_config",
    "compile_fused_for_arch",
    "get_fused_kernel",
    "FUSED_MAX_M",
    "FUSED_TAG_MAX_M",
    "fused_is_default",
    "tile_weights",
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


def code_hash(paths) -> str:
    """Hash of these Python files with comments, trailing blanks and empty lines removed, so a
    comment edit keeps the disk-cached kernels valid. Comments are found by tokenize, whose
    COMMENT tokens are the same on every Python version (ast.dump is not: 3.12 added fields,
    and the kernels are precompiled on one Python and loaded on another)."""
    h = hashlib.sha256()
    for path in paths:
        src = Path(path).read_text()
        lines = src.splitlines()
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.COMMENT:
                row, col = tok.start
                lines[row - 1] = lines[row - 1][:col]
        h.update("\n".join(ln.rstrip() for ln in lines if ln.strip()).encode())
    return h.hexdigest()[:12]


@functools.cache
def _source_hash(names: tuple[str, ...] = ("kernels.py", "fused.py", "ptx.py", "config.py")) -> str:
    """code_hash of the files in this package the kernels are built from (part of every
    disk-cache key)."""
    return code_hash(Path(__file__).parent / name for name in names)


def _device_arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"


def _fn_name(cfg: Config, n: int, k: int, arch: str) -> tuple[str, str]:
    tag = f"{cfg.key()}_n{n}_k{k}_{arch}_{_cutlass_version()}_{_source_hash()}"
    return "skinny_" + hashlib.sha256(tag.encode()).hexdigest()[:20], tag


def disk_cached(fname: str, tag: str, build, use_disk: bool = True):
    """The compiled function `fname` from the disk cache, else build() it and export it there.

    One mechanism for every kernel family (GEMMs, the fused step, elementwise)."""
    path = cache_dir() / f"{fname}.o"
    if use_disk and path.exists():
        try:
            import cutlass.cute as cute

            mod = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
            return getattr(mod, fname)
        except Exception:
            pass  # stale or broken file: recompile
    fn = build()
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


def memoized(key, make):
    """In-process cache of compiled functions; cute.compile is not thread-safe, so one lock."""
    fn = _compiled.get(key)
    if fn is None:
        with _lock:
            fn = _compiled.get(key)
            if fn is None:
                fn = _compiled[key] = make()
    return fn


def _compile(cfg: Config, n: int, k: int, arch: str | None, use_disk: bool = True):
    from . import kernels

    arch = arch or _device_arch()
    fname, tag = _fn_name(cfg, n, k, arch)
    return disk_cached(fname, tag, lambda: kernels.compile_tvm_ffi(cfg, n, k, extra_options=f"--gpu-arch {arch}"),
                       use_disk)


def get_kernel(cfg: Config, n: int, k: int, arch: str | None = None):
    """Compiled TVM-FFI callable ``fn(x, w, out)`` for this config and shape (cached)."""
    return memoized((cfg, n, k, arch), lambda: _compile(cfg, n, k, arch))


def compile_for_arch(config: Config, n: int, k: int, arch: str = "sm_90a", sass: bool = False) -> str:
    """Compile without a GPU and return the PTX text (sass: the SASS, see sass_of)."""
    from . import kernels

    def build(opts):
        return kernels.compile_tvm_ffi(config, n, k, extra_options=opts)

    return kernel_text(build, arch, sass)


def ptx_of(build, arch: str) -> str:
    """PTX text of build(extra_options) compiled for `arch` with the PTX kept (no GPU needed).
    The caller holds the compile lock."""
    with tempfile.TemporaryDirectory() as d:
        fn = build(f"--gpu-arch {arch} --keep-ptx --dump-dir {d}")
        ptx = getattr(fn, "__ptx__", None)
        if ptx and not ptx.lstrip().startswith("//") and ".version" not in ptx:
            p = Path(ptx)  # some versions give a path, others the text
            if p.exists():
                ptx = p.read_text()
        if not ptx:
            files = list(Path(d).glob("*.ptx"))
            ptx = files[0].read_text() if files else ""
    return ptx


def cubin_regcount(cubin: bytes) -> int:
    """Registers per thread (EIATTR_REGCOUNT) of the single kernel in a cubin's .nv.info."""
    import struct

    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    stroff = secs[shstrndx][4]
    for s in secs:
        name = cubin[stroff + s[0]:cubin.index(b"\0", stroff + s[0])]
        if name == b".nv.info":
            data, i = cubin[s[4]:s[4] + s[5]], 0
            while i + 4 <= len(data):
                fmt, attr, size = data[i], data[i + 1], struct.unpack_from("<H", data, i + 2)[0]
                if fmt == 4 and attr == 0x2F:
                    return struct.unpack_from("<II", data, i + 4)[1]
                i += 4 + size if fmt == 4 else 4
    raise ValueError("no EIATTR_REGCOUNT in the cubin")


def cubin_of(build, arch: str) -> bytes:
    """Cubin of build(extra_options) compiled for `arch` (no GPU needed; caller holds the lock)."""
    with tempfile.TemporaryDirectory() as d:
        fn = build(f"--gpu-arch {arch} --keep-cubin --dump-dir {d}")
        cub = getattr(fn, "__cubin__", None)
        if isinstance(cub, str) and Path(cub).exists():
            cub = Path(cub).read_bytes()
        if not cub:
            files = list(Path(d).glob("*.cubin"))
            cub = files[0].read_bytes() if files else b""
    return cub


def nvdisasm_path() -> str | None:
    """nvdisasm from the nvidia-cuda-nvdisasm wheel (a dev dependency) or the PATH."""
    import glob
    import shutil

    try:
        import nvidia

        for base in nvidia.__path__:
            hits = sorted(glob.glob(os.path.join(base, "*", "bin", "nvdisasm")))
            if hits:
                return hits[-1]
    except ImportError:
        pass
    return shutil.which("nvdisasm")


def kernel_text(build, arch: str, sass: bool) -> str:
    """The PTX (or, with sass, the SASS) of build(extra_options) for `arch`, no GPU needed."""
    if sass:
        return sass_of(build, arch)
    with _lock:
        return ptx_of(build, arch)


def sass_of(build, arch: str = "sm_90a") -> str:
    """SASS text (nvdisasm) of build(extra_options) for `arch`: what ptxas made of the PTX,
    e.g. whether the weight loads really precede griddepcontrol.wait (ACQBULK)."""
    import subprocess

    tool = nvdisasm_path()
    if tool is None:
        raise RuntimeError("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    with _lock:
        cub = cubin_of(build, arch)
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.cubin"
        f.write_bytes(cub)
        return subprocess.run([tool, "-c", str(f)], capture_output=True, text=True, check=True).stdout


# --------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------
def tile_weights(w, wl: int = 1):
    """A prepacked weight layout read by configs with ``weight_layout`` = 1 or 2, from [N, K] bf16
    (K % 32 == 0), returned with the same [N, K] shape; a one-time preprocessing of a weight,
    like any prepacked layout.

    wl = 1 (N % 8 == 0): each (8-row tile, 32-wide K step) is 512 contiguous bytes in the order
    the mma lanes load them as the B operand (lane g*4+t: row g, columns t*8..t*8+8).
    wl = 2 (N % 16 == 0; configs with ``weights_as_a``, weights as the mma A operand): each (16-row tile,
    32-wide K step) is 1 KB, two 512-byte halves (the two k16 mma steps), lane g*4+t holding 16
    bytes of each: rows g and g + 8 of columns p, p+1 (a0, a1) and p+2, p+3 (a2, a3), p = t*8
    (first half) or t*8 + 4 (second half): each 128-bit load is one A fragment, no register moves."""
    n, k = w.shape
    if wl == 2:
        if n % 16 or k % 32:
            raise ValueError(f"tile_weights(wl=2) needs N % 16 == 0 and K % 32 == 0, got {tuple(w.shape)}")
        # [tile, h(row g / g+8), g, step, t, kk(k16 half), j(a0|a2), e] -> [tile, step, kk, g, t, j, h, e]
        v = w.reshape(n // 16, 2, 8, k // 32, 4, 2, 2, 2)
        return v.permute(0, 3, 5, 2, 4, 6, 1, 7).contiguous().view(n, k)
    if n % 8 or k % 32:
        raise ValueError(f"tile_weights needs N % 8 == 0 and K % 32 == 0, got {tuple(w.shape)}")
    return w.reshape(n // 8, 8, k // 32, 32).permute(0, 2, 1, 3).contiguous().view(n, k)


def skinny_gemm(x, w, out=None, config: Config | None = None):
    """out[M, N] = x[M, K] @ w[N, K]^T on torch's current stream.

    With a ``weight_layout`` = 1 or 2 config, w must be in that layout (tile_weights(w, wl)).

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


# --------------------------------------------------------------------------------------
# fused whole KDA step
# --------------------------------------------------------------------------------------
_workspaces: dict[tuple, Any] = {}


def supports_fused(m: int, n: int, k: int, fa_col: int, nb: int, kb: int, dtype,
                   x_row_stride: int, out_row_stride: int) -> str | None:
    """None if ``kda_fused_step`` handles this problem, else a human-readable reason."""
    if not _dtype_is_bf16(dtype):
        return f"dtype {dtype} is not bfloat16"
    if m < 1 or m > MAX_M:
        return f"M={m} outside 1..{MAX_M}"
    if k < 32 or k % 32:
        return f"K={k} must be a positive multiple of 32"
    if x_row_stride < k or x_row_stride % 8:
        return f"x row stride {x_row_stride} must be >= K and a multiple of 8"
    if out_row_stride < n or out_row_stride % 8:
        return f"out row stride {out_row_stride} must be >= N and a multiple of 8"
    try:
        cfg = default_fused_config(m, n, k, kb, fa_col)
    except ValueError as e:
        return str(e)
    return check_fused(cfg, m, n, k, fa_col, nb, kb)


def _compile_fused(cfg: Config, n: int, k: int, a0: int, nb: int, kb: int, arch: str | None,
                   use_disk: bool = True):
    from . import fused

    arch = arch or _device_arch()
    tag = (f"{cfg.key()}_n{n}_k{k}_a{a0}_nb{nb}_kb{kb}_{arch}_{_cutlass_version()}_"
           f"{_source_hash()}")
    fname = "kdafused_" + hashlib.sha256(tag.encode()).hexdigest()[:20]
    return disk_cached(fname, tag, lambda: fused.compile_fused_tvm_ffi(
        cfg, n, k, a0, nb, kb, extra_options=f"--gpu-arch {arch}"), use_disk)


def get_fused_kernel(cfg: Config, n: int, k: int, a0: int, nb: int, kb: int,
                     arch: str | None = None):
    """Compiled TVM-FFI callable ``fn(x, w, out, w_fb, g1, counter)`` (cached)."""
    return memoized(("fused", cfg, n, k, a0, nb, kb, arch), lambda: _compile_fused(cfg, n, k, a0, nb, kb, arch))


def compile_fused_for_arch(config: Config, n: int, k: int, a0: int, nb: int, kb: int,
                           arch: str = "sm_90a", sass: bool = False) -> str:
    """Compile the fused kernel without a GPU and return the PTX text (sass: the SASS)."""
    from . import fused

    def build(opts):
        return fused.compile_fused_tvm_ffi(config, n, k, a0, nb, kb, extra_options=opts)

    return kernel_text(build, arch, sass)


_WS_WORDS = 1 << 14  # 64 KiB: any m_tile <= 16 fused grid needs < 16 KiB
_retired: list = []  # outgrown workspaces stay alive: captured graphs may still point at them


def new_fused_workspace(device):
    """A zeroed workspace for one fused step of an executor, made at build time: a workspace made
    lazily inside someone's capture (torch.compile's cudagraph trees) would live in that graph's
    pool without being one of its outputs, which the trees refuse."""
    import torch

    return torch.zeros(_WS_WORDS, dtype=torch.int32, device=device)


def _workspace_for(device, words: int):
    """The zeroed workspace of this (device, stream), at least `words` int32 words."""
    import torch

    key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    ws = _workspaces.get(key)
    if ws is None or ws.numel() < words:
        if ws is not None:
            _retired.append(ws)
        ws = torch.zeros(max(words, _WS_WORDS), dtype=torch.int32, device=device)
        _workspaces[key] = ws
    return ws


def kda_fused_step(x, w_packed, w_fb, out, g1, fa_col: int = 6144,
                   config: Config | None = None, workspace=None, w_swap=None):
    """One launch on torch's current stream: out = x @ w_packed^T and
    g1 = out[:, fa_col:fa_col+KB] @ w_fb^T (see the module docstring). Returns (out, g1).
    w_swap: the same weight in the A-fragment layout (tile_weights(w_packed, 2), made once by
    the caller); with it and no explicit config the default config takes the weights as the mma
    A operand and reads w_swap (faster at every M, see defaults.FUSED_SETTINGS)."""
    import torch

    if x.dim() != 2 or w_packed.dim() != 2 or w_fb.dim() != 2:
        raise ValueError("x, w_packed and w_fb must be 2-D")
    m, k = x.shape
    n, kw = w_packed.shape
    nb, kb = w_fb.shape
    if kw != k:
        raise ValueError(f"K mismatch: x {tuple(x.shape)} w_packed {tuple(w_packed.shape)}")
    for name, t in (("x", x), ("w_packed", w_packed), ("w_fb", w_fb), ("out", out), ("g1", g1)):
        if t.dtype != torch.bfloat16:
            raise ValueError(f"{name} must be bfloat16")
    if out.shape != (m, n) or g1.shape != (m, nb):
        raise ValueError(f"out must be {(m, n)} and g1 {(m, nb)}, got {tuple(out.shape)}, "
                         f"{tuple(g1.shape)}")
    if m == 0:
        return out, g1
    if x.stride(1) != 1 or out.stride(1) != 1 or g1.stride(1) != 1:
        raise ValueError("x, out and g1 need unit stride along the last dim")
    if not (w_packed.is_contiguous() and w_fb.is_contiguous()):
        raise ValueError("w_packed and w_fb must be contiguous")
    reason = supports_fused(m, n, k, fa_col, nb, kb, x.dtype, x.stride(0), out.stride(0))
    if reason is not None:
        raise ValueError(f"kda_fused_step unsupported: {reason}")
    for name, t in (("x", x), ("w_packed", w_packed), ("w_fb", w_fb), ("out", out)):
        if t.data_ptr() % 16:
            raise ValueError(f"{name} must be 16-byte aligned")
    if w_swap is not None and (w_swap.shape != w_packed.shape or w_swap.dtype != w_packed.dtype
                               or not w_swap.is_contiguous() or w_swap.data_ptr() % 16):
        raise ValueError("w_swap must be a contiguous, 16-byte aligned copy of w_packed's shape and dtype")
    cfg = config if config is not None else default_fused_config(m, n, k, kb, fa_col, w_swap is not None)
    if config is None and cfg.weights_as_a:
        w_packed = w_swap
    if config is None and not fused_is_default(cfg, m):
        skinny_gemm(x, w_packed, out)
        skinny_gemm(out[:, fa_col:fa_col + kb], w_fb, g1)
        return out, g1
    why = check_fused(cfg, m, n, k, fa_col, nb, kb)
    if why is not None:
        raise ValueError(f"config {cfg.key()} cannot run this step: {why}")
    words = fused_workspace_words(cfg, n, fa_col, kb, nb)
    if workspace is None:
        workspace = _workspace_for(x.device, words)
    elif (workspace.dtype != torch.int32 or workspace.numel() < words
          or not workspace.is_contiguous()):
        raise ValueError(f"workspace must be a contiguous int32 tensor with >= {words} elements "
                         "(zeroed once)")
    g1_align = (0, 4, 16)[cfg.g1_stores]  # bytes per g1 store
    if cfg.g1_stores and (g1.data_ptr() % g1_align or g1.stride(0) * 2 % g1_align):
        raise ValueError(f"config g1_stores={cfg.g1_stores} needs g1 rows aligned to {g1_align} bytes")
    fn = get_fused_kernel(cfg, n, k, fa_col, nb, kb)
    fn(x, w_packed, out, w_fb, g1, workspace[:1])
    return out, g1
