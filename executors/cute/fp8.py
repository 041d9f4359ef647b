"""CuTe DSL fp8 (e4m3) skinny GEMM for decode, M <= 16 (H200, sm_90a).

    out[M, N] = (x[M, K] * scale_a) @ (w[N, K] * scale_b)^T     fp32 accumulation, bf16 or fp32 out

Scales (fp32), by kind:

* ``scale_a``: "tensor" (one value), "row" ([M, 1], one per token) or "block" ([M, ceil(K/128)],
  one per token and 128-wide K group: DeepSeek-V3's activation scales; any strides).
* ``scale_b``: "tensor", "col" ([N, 1], one per weight row = output column; "row" is accepted as
  the same kind) or "block" ([ceil(N/128), ceil(K/128)], one per 128x128 weight block; any strides).

The kernel walks K in 128-wide blocks (K % 128 == 0). Each block's products are summed into a
fresh fp32 partial, which is multiplied by the block's sa * sb (block kinds) and added to the fp32
accumulator; per-tensor / per-row / per-column factors are applied once at the end.

Hopper runs fp8 ``mma.sync`` as conversions to f16 plus f16 mma (seen in the SASS), so the kernel
converts itself, each 32-bit word of 4 e4m3 values once per lane, and issues m16n8k16 f16 mma:
word j of a 16-byte vector feeds the j-th k16 mma of that 64-wide K step, for x and the weights
alike, so both operands see the same K permutation. ``hw`` words of every vector go through the
hardware cvt (F2FP, whose throughput on sm_90 is limited: at the HBM floor it would need about
half of it on its own, an estimate not yet measured), the others through integer ops (exact,
2^-8 times the value, into a second partial scaled by 2^16 when the K block is promoted): two
pipes share the conversion work. See ``BITS_PROGRAM`` for the integer conversion.

Public API (torch / cutlass imported lazily: importing this module needs neither):

* ``supports_fp8(m_max, n, k, scale_a_kind, scale_b_kind, device)`` -> None or a reason
* ``gemm_fp8(x, w, scale_a, scale_b, out=None, out_dtype=None)`` -> out (out_dtype None: out's
  dtype when out is given, else torch.bfloat16; torch.float32 also works)
* ``Fp8Config``, ``default_fp8_config(m, n, k)`` (the measured table executors/cute/fp8_defaults.py,
  else ``heuristic_fp8_config``), ``fp8_configs_for(m, n, k)``, ``fp8_config_grid(m, n, k)``,
  ``fp8_bulk_grid(m, n, k)`` (the bulk-copy ring's sweep), ``fp8_ahead_grid(m, n, k)``,
  ``fp8_pre_grid(m, n, k)`` (the L2 prefetch before the PDL wait), ``fp8_hold_grid(m, n, k)``
  (rings held on chip beside the next kernel's blocks), ``fp8_wg_grid(m, n, k)`` (the warpgroup
  wgmma kernel, Fp8Config.wg), ``fp8_wgr_grid(m, n, k)`` (the register-weights warpgroup kernel,
  Fp8Config.wgr, with its clusters along K),
  ``compile_fp8_for_arch(...)`` (PTX / SASS without a GPU), ``get_fp8_kernel(...)``

Kernels are compiled once per (config, N, K, scale kinds, out dtype, arch), cached in process and
on disk with the bf16 kernels' machinery (executors.cute.disk_cached), and launched on torch's
current stream with programmatic dependent launch: the first weight vectors and weight scales
are loaded before ``griddepcontrol.wait``, x and scale_a after it.

Weights reach the mma either straight into registers (``depth`` iterations ahead) or, with
``Fp8Config.bulk`` = S, through a per-warp ring of S shared-memory stages filled by TMA bulk
copies that complete on an mbarrier per stage (fp8_lane.py describes the protocol); x and its
scales are loaded ``xahead`` iterations ahead. ``Fp8Config.wg`` selects the warpgroup kernel
instead (fp8_wg.py): Hopper's native fp8 wgmma (x from registers, the weights from shared
memory), so neither operand is converted (tokens as the wgmma's M, 8 * tiles weight rows per
warpgroup as its N); measured slower than the lane program, in no default. ``Fp8Config.wgr``
selects the register-weights warpgroup kernel (fp8_wgr.py): 64 weight rows as wgmma's A, loaded
from global memory into the fragments without shared memory, x staged into shared memory in the
same K permutation as B, warpgroups and optionally a thread-block cluster (``ks``) splitting K;
the table uses it at DeepSeek-V3 q_b for M <= 8. The measured table picks per shape and M bucket.
"""

from __future__ import annotations

import hashlib

__all__ = [
    "BLOCK",
    "FP8_MAX_M",
    "SCALE_A_KINDS",
    "SCALE_B_KINDS",
    "Fp8Config",
    "supports_fp8",
    "gemm_fp8",
    "scale_kind",
    "default_fp8_config",
    "heuristic_fp8_config",
    "fp8_config_grid",
    "fp8_bulk_grid",
    "fp8_ahead_grid",
    "fp8_pre_grid",
    "fp8_hold_grid",
    "fp8_wg_grid",
    "fp8_wgr_grid",
    "fp8_configs_for",
    "compile_fp8_for_arch",
    "get_fp8_kernel",
    "dequant_reference",
    "blockwise_reference",
]

from .fp8_config import (  # noqa: F401  - re-exported: the fp8 API
    _A_CODE,
    _B_CODE,
    BITS_PROGRAM,
    BLOCK,
    FP8_MAX_M,
    SCALE_A_KINDS,
    SCALE_B_KINDS,
    SMS,
    Fp8Config,
    bits_ptx,
    bits_words,
    default_fp8_config,
    heuristic_fp8_config,
    scale_kind,
    word_byte_order,
)
from .fp8_sweeps import (  # noqa: F401  - re-exported: the fp8 API
    fp8_ahead_grid,
    fp8_bulk_grid,
    fp8_config_grid,
    fp8_configs_for,
    fp8_hold_grid,
    fp8_pre_grid,
    fp8_wg_grid,
    fp8_wgr_grid,
)


# --------------------------------------------------------------------------------------
# reference of the scaling math (pure torch, CPU or GPU)
# --------------------------------------------------------------------------------------
def _expand_scale(scale, kind: str, rows: int, k: int, operand: str):
    """[rows, K] fp32 factor that multiplies the operand elementwise."""

    s = scale.float()
    if kind == "tensor":
        return s.reshape(1, 1).expand(rows, k)
    if kind in ("row", "col"):
        return s.reshape(rows, 1).expand(rows, k)
    if operand == "a":
        return s.repeat_interleave(BLOCK, dim=1)[:, :k]
    return s.repeat_interleave(BLOCK, dim=0)[:rows].repeat_interleave(BLOCK, dim=1)[:, :k]


def dequant_reference(x, w, scale_a, scale_b):
    """fp32 out = (x * scale_a) @ (w * scale_b)^T with the operands dequantized elementwise:
    the straightforward definition the kernel's per-K-block scaling must agree with."""
    m, k = x.shape
    n = w.shape[0]
    ka = scale_kind(scale_a.shape, m, k, "a")
    kbk = scale_kind(scale_b.shape, n, k, "b")
    xa = x.float() * _expand_scale(scale_a, ka, m, k, "a")
    wb = w.float() * _expand_scale(scale_b, kbk, n, k, "b")
    return xa @ wb.t()


def blockwise_reference(x, w, scale_a, scale_b):
    """fp32 out computed the way the kernel orders it: per 128-wide K block a partial sum of the
    raw fp8 products, times that block's scale_a * scale_b (block kinds), added to the
    accumulator; per-tensor / row / column factors applied at the end."""
    import torch

    m, k = x.shape
    n = w.shape[0]
    ka = scale_kind(scale_a.shape, m, k, "a")
    kbk = scale_kind(scale_b.shape, n, k, "b")
    sa = scale_a.float()
    sb = scale_b.float()
    acc = torch.zeros(m, n, dtype=torch.float32, device=x.device)
    xf, wf = x.float(), w.float()
    for kb in range(k // BLOCK):
        part = xf[:, kb * BLOCK:(kb + 1) * BLOCK] @ wf[:, kb * BLOCK:(kb + 1) * BLOCK].t()
        fa = sa.reshape(m, -1)[:, kb:kb + 1] if ka == "block" else 1.0
        fb = sb.repeat_interleave(BLOCK, dim=0)[:n, kb].reshape(1, n) if kbk == "block" else 1.0
        acc = acc + part * (fa * fb)
    if ka == "tensor":
        acc = acc * sa.reshape(())
    elif ka == "row":
        acc = acc * sa.reshape(m, 1)
    if kbk == "tensor":
        acc = acc * sb.reshape(())
    elif kbk == "col":
        acc = acc * sb.reshape(1, n)
    return acc


# --------------------------------------------------------------------------------------
# capability check
# --------------------------------------------------------------------------------------
def _kind_reason(scale_a_kind: str, scale_b_kind: str) -> str | None:
    if scale_a_kind not in _A_CODE:
        return f"scale_a kind {scale_a_kind!r} is not one of {list(SCALE_A_KINDS)}"
    if scale_b_kind not in _B_CODE:
        return f"scale_b kind {scale_b_kind!r} is not one of {list(SCALE_B_KINDS)} (or 'row')"
    return None


def supports_fp8(m_max: int, n: int, k: int, scale_a_kind: str, scale_b_kind: str,
                 device=None) -> str | None:
    """None if ``gemm_fp8`` runs every M in 1..m_max at this N, K and these scale kinds on
    ``device`` (None: skip the device checks), else a human-readable reason."""
    why = _kind_reason(scale_a_kind, scale_b_kind)
    if why is not None:
        return why
    if not 1 <= int(m_max) <= FP8_MAX_M:
        return f"M={m_max} outside 1..{FP8_MAX_M} (decode kernel)"
    if n < 1:
        return f"N={n} must be positive"
    if k < BLOCK or k % BLOCK:
        return f"K={k} must be a positive multiple of {BLOCK}"
    for m in sorted({min(int(m_max), 8), int(m_max)}):
        try:
            cfg = default_fp8_config(m, n, k, kinds=(scale_a_kind, scale_b_kind))
        except ValueError as e:
            return str(e)
        why = cfg.check(m, n, k)
        if why is not None:
            return why
    if device is not None:
        return _device_reason(device)
    return None


def _device_reason(device) -> str | None:
    try:
        import torch
    except Exception as e:  # pragma: no cover - torch is a dependency
        return f"torch not importable: {e}"
    dev = torch.device(device)
    if dev.type != "cuda":
        return f"device {dev} is not a CUDA device"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    cc = torch.cuda.get_device_capability(dev)
    if cc < (9, 0):
        return f"compute capability {cc[0]}.{cc[1]} < 9.0 (needs sm_90: PDL, e4m3 conversions)"
    from . import importable

    if not importable():
        return "nvidia-cutlass-dsl is not importable"
    return None


# --------------------------------------------------------------------------------------
# compilation and caching (the package's machinery)
# --------------------------------------------------------------------------------------
def _out_code(out_dtype) -> int:
    """0 = bf16, 1 = fp32."""
    s = str(out_dtype)
    if s in ("torch.bfloat16", "bfloat16", "bf16"):
        return 0
    if s in ("torch.float32", "float32", "fp32"):
        return 1
    raise ValueError(f"out_dtype {out_dtype} must be bfloat16 or float32")


# the files the kernel is built from (part of its disk-cache key; a test checks it covers the
# package modules fp8_kernels.py and fp8_lane.py import)
KERNEL_SOURCES = ("fp8.py", "fp8_config.py", "fp8_lane.py", "fp8_wg.py", "fp8_wgr.py", "fp8_kernels.py", "ptx.py",
                  "ptx_wg.py", "kernels.py")


def _tag(cfg: Fp8Config, n: int, k: int, a: int, b: int, o: int, arch: str) -> tuple[str, str]:
    from . import _cutlass_version, _source_hash

    src = _source_hash(KERNEL_SOURCES)
    tag = f"{cfg.key()}_n{n}_k{k}_a{a}_b{b}_o{o}_{arch}_{_cutlass_version()}_{src}"
    return "fp8gemm_" + hashlib.sha256(tag.encode()).hexdigest()[:20], tag


def _compile(cfg, n, k, a, b, o, arch, use_disk=True):
    from . import _device_arch, disk_cached, fp8_kernels

    arch = arch or _device_arch()
    fname, tag = _tag(cfg, n, k, a, b, o, arch)
    return disk_cached(fname, tag, lambda: fp8_kernels.compile_tvm_ffi(
        cfg, n, k, a, b, o, extra_options=f"--gpu-arch {arch}"), use_disk)


def get_fp8_kernel(cfg: Fp8Config, n: int, k: int, scale_a_kind: str, scale_b_kind: str,
                   out_dtype="bfloat16", arch: str | None = None):
    """Compiled TVM-FFI callable ``fn(x_u8, w_u8, sa2d, sb2d, out)`` (cached)."""
    from . import memoized

    a, b, o = _A_CODE[scale_a_kind], _B_CODE[scale_b_kind], _out_code(out_dtype)
    return memoized(("fp8", cfg, n, k, a, b, o, arch), lambda: _compile(cfg, n, k, a, b, o, arch))


def compile_fp8_for_arch(cfg: Fp8Config, n: int, k: int, scale_a_kind: str = "block",
                         scale_b_kind: str = "block", out_dtype="bfloat16", arch: str = "sm_90a",
                         sass: bool = False) -> str:
    """Compile without a GPU; return the PTX text (sass: the SASS)."""
    from . import fp8_kernels, kernel_text

    a, b, o = _A_CODE[scale_a_kind], _B_CODE[scale_b_kind], _out_code(out_dtype)

    def build(opts):
        return fp8_kernels.compile_tvm_ffi(cfg, n, k, a, b, o, extra_options=opts)

    return kernel_text(build, arch, sass)


# --------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------
def _scale_2d(scale, kind: str, rows: int, name: str):
    """A 2-D fp32 view the kernel indexes with (row, K block) and the view's strides."""
    if kind == "tensor":
        return scale.reshape(1, 1)
    if kind in ("row", "col"):
        return scale.reshape(rows, 1) if scale.dim() == 1 else scale
    if scale.dim() != 2:
        raise ValueError(f"{name} block scales must be 2-D")
    return scale


def gemm_fp8(x, w, scale_a, scale_b, out=None, out_dtype=None, config: Fp8Config | None = None,
             timeline=None):
    """out[M, N] = (x * scale_a) @ (w * scale_b)^T on torch's current stream; returns out.

    x: float8_e4m3fn [M, K], 1 <= M <= 16, unit column stride, row stride % 16 == 0, 16-byte
    aligned. w: float8_e4m3fn [N, K] contiguous, 16-byte aligned. scale_a / scale_b: fp32, kinds
    inferred from their shapes (see the module docstring). out: [M, N] bf16 or fp32 with unit
    column stride (may be a column slice of a wider buffer); allocated when None, with out_dtype
    (default bf16). timeline: with a ``config.timeline`` config (diagnostics), a contiguous int64
    CUDA tensor of >= 8 words per block that receives the blocks' stamps (Fp8Config.timeline).
    Raises ValueError for anything it cannot run."""
    import torch

    if out_dtype is None:
        out_dtype = out.dtype if out is not None else torch.bfloat16
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"x and w must be 2-D, got {tuple(x.shape)} and {tuple(w.shape)}")
    m, k = x.shape
    n, kw = w.shape
    if kw != k:
        raise ValueError(f"K mismatch: x {tuple(x.shape)} w {tuple(w.shape)}")
    for name, t in (("x", x), ("w", w)):
        if t.dtype != torch.float8_e4m3fn:
            raise ValueError(f"{name} must be torch.float8_e4m3fn, got {t.dtype}")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}")
    ka = scale_kind(scale_a.shape, m, k, "a")
    kbk = scale_kind(scale_b.shape, n, k, "b")
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    elif tuple(out.shape) != (m, n) or out.dtype != out_dtype:
        raise ValueError(f"out must be {out_dtype} {(m, n)}, got {out.dtype} {tuple(out.shape)}")
    if timeline is not None and not isinstance(timeline, torch.Tensor):
        raise ValueError(f"timeline must be a torch.Tensor, got {type(timeline).__name__}")
    if config is not None and config.timeline:
        words = 8 * config.grid(n)
        if (timeline is None or timeline.dtype != torch.int64 or timeline.device != x.device
                or not timeline.is_contiguous() or timeline.numel() < words):
            raise ValueError(f"config {config.key()} stamps a timeline: pass timeline=, a contiguous "
                             f"int64 tensor of >= {words} words on {x.device}")
    elif timeline is not None:
        raise ValueError("timeline= needs a config with timeline=True")
    if m == 0:
        return out
    why = supports_fp8(m, n, k, ka, kbk)
    if why is not None:
        raise ValueError(f"gemm_fp8 unsupported: {why}")
    if not x.is_cuda:
        raise ValueError("gemm_fp8 runs on CUDA tensors (x is on the CPU)")
    if x.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("x and out need unit stride along the last dim")
    if m == 1 and x.stride(0) % 16:  # one row: any row stride is as good as K
        x = x.as_strided((1, k), (k, 1))
    if x.stride(0) % 16 or x.stride(0) < k:
        raise ValueError(f"x row stride {x.stride(0)} must be >= K and a multiple of 16")
    if not w.is_contiguous():
        raise ValueError("w must be contiguous")
    if x.data_ptr() % 16 or w.data_ptr() % 16:
        raise ValueError("x and w must be 16-byte aligned")
    cfg = config if config is not None else default_fp8_config(m, n, k, kinds=(ka, kbk))
    why = cfg.check(m, n, k)
    if why is not None:
        raise ValueError(f"config {cfg.key()} cannot run M={m} N={n} K={k}: {why}")
    extra = () if timeline is None else (timeline.view(-1),)
    sa2 = _scale_2d(scale_a, ka, m, "scale_a")
    sb2 = _scale_2d(scale_b, kbk, n, "scale_b")
    fn = get_fp8_kernel(cfg, n, k, ka, kbk, "float32" if out_dtype == torch.float32 else "bfloat16")
    fn(x.view(torch.uint8), w.view(torch.uint8), sa2, sb2, out, *extra)
    return out
