"""CuTe DSL row-strided bf16 add: out[r, :] = a[r, :] + b[r, :].

Zero-copy packing has producers write straight into a column slot of a packed buffer
([rows, 4*7168] bf16, row stride 28672). torch's elementwise kernel does not vectorize a
row-strided output (55 us vs 30 us contiguous at 2048 rows on the H200); this kernel does
128-bit loads and stores whatever the row strides are.

    a, b, out: bf16 [rows, cols], stride(1) == 1, row strides % 8 == 0 elements,
               16-byte aligned base pointers; cols % 8 == 0; rows dynamic (any >= 0).
    Math: each bf16 widened to fp32, one fp32 add, rounded to bf16 (round to nearest
    even), which is what torch.add does for bf16 (fp32 opmath, alpha 1), so the results
    are bit-identical for finite inputs.

Grid: x = rows (up to 2^31 - 1), y = column chunks of THREADS * VEC 8-element vectors.
Each thread issues all its loads first (index clamped into the row, so every load is in
bounds) and then its predicated stores. ``out`` may alias ``a`` or ``b`` exactly (each
element is read and written by the same thread).

Compiled once per (threads, vec, arch) for the TVM-FFI calling convention with the
environment stream (every call launches on torch's current stream, so side streams and
CUDA-graph capture work) and cached in process and on disk next to the GEMM kernels
(``$PLANNER_CACHE_DIR/cute``). Importing this module needs neither cutlass nor a GPU.
"""



import hashlib
import threading

__all__ = ["supports_add", "strided_add", "add_config", "compile_add_for_arch", "get_add_kernel"]

_lock = threading.Lock()


def add_config(cols: int) -> tuple[int, int]:
    """(threads per block, 8-element vectors per thread) for a row of ``cols`` elements."""
    nvec = max(cols // 8, 1)
    if nvec % 128 == 0:
        per = nvec // 128
        for v in (4, 2):
            if per % v == 0:
                return 128, v
        return 128, 1
    if nvec <= 128:
        return 128, 1
    return 256, 1


def supports_add(shape, a_strides, b_strides, out_strides, dtype) -> str | None:
    """None if ``strided_add`` handles this call, else a human-readable reason.

    shape: (rows, cols); *_strides: (row stride, col stride) in elements."""
    from . import _dtype_is_bf16

    if not _dtype_is_bf16(dtype):
        return f"dtype {dtype} is not bfloat16"
    if len(shape) != 2:
        return f"needs 2-D tensors, got shape {tuple(shape)}"
    rows, cols = shape
    if cols < 8 or cols % 8:
        return f"column count {cols} is not a positive multiple of 8"
    for name, st in (("a", a_strides), ("b", b_strides), ("out", out_strides)):
        if len(st) != 2:
            return f"{name} is not 2-D"
        if st[1] != 1:
            return f"{name} column stride {st[1]} != 1"
        if rows > 1 and (st[0] % 8 or st[0] < cols):
            return f"{name} row stride {st[0]} is not a multiple of 8 that is >= {cols}"
    return None


# --------------------------------------------------------------------------------------
# kernel (cutlass imported only here)
# --------------------------------------------------------------------------------------
def _build(threads: int, vec: int):
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T, dsl_user_op

    # 128-bit coherent load and 16-byte store (shared with the GEMM kernels)
    from .ptx import ld_act_v4, st_global_words

    @dsl_user_op
    def add_bf16x2(x: Int32, y: Int32, *, loc=None, ip=None):
        """bf16x2 + bf16x2 with fp32 math and round-to-nearest-even (torch's bf16 add)."""
        res = llvm.inline_asm(
            T.i32(),
            [Int32(x).ir_value(loc=loc, ip=ip), Int32(y).ir_value(loc=loc, ip=ip)],
            "{\n\t.reg .b32 xl, xh, yl, yh;\n\t"
            "shl.b32 xl, $1, 16;\n\tand.b32 xh, $1, 0xffff0000;\n\t"
            "shl.b32 yl, $2, 16;\n\tand.b32 yh, $2, 0xffff0000;\n\t"
            "add.rn.f32 xl, xl, yl;\n\tadd.rn.f32 xh, xh, yh;\n\t"
            "cvt.rn.bf16x2.f32 $0, xh, xl;\n\t}",
            "=r,r,r",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
        return Int32(res)

    THREADS = threads
    VEC = vec
    CHUNK = threads * vec  # vectors per block

    @cute.kernel
    def kernel(mA: cute.Tensor, mB: cute.Tensor, mO: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        row, chunk, _ = cute.arch.block_idx()
        nvec = mO.shape[1] // 8
        ra = Int64(row) * Int64(mA.stride[0]) * 2
        rb = Int64(row) * Int64(mB.stride[0]) * 2
        ro = Int64(row) * Int64(mO.stride[0]) * 2
        a_base = mA.iterator.toint() + ra
        b_base = mB.iterator.toint() + rb
        o_base = mO.iterator.toint() + ro
        sums = []
        for v in cutlass.range_constexpr(VEC):
            j = chunk * CHUNK + v * THREADS + tid
            jc = cutlass.min(j, nvec - 1)
            xa = ld_act_v4(a_base + Int64(jc) * 16)
            xb = ld_act_v4(b_base + Int64(jc) * 16)
            sums.append([add_bf16x2(xa[q], xb[q]) for q in range(4)])
        for v in cutlass.range_constexpr(VEC):
            j = chunk * CHUNK + v * THREADS + tid
            if j < nvec:
                st_global_words(o_base + Int64(j) * 16, sums[v])

    @cute.jit
    def host(mA: cute.Tensor, mB: cute.Tensor, mO: cute.Tensor, stream):
        rows = mO.shape[0]
        nchunk = (mO.shape[1] // 8 + CHUNK - 1) // CHUNK
        kernel(mA, mB, mO).launch(grid=(rows, nchunk, 1), block=(THREADS, 1, 1), stream=stream)

    return host


def _fake_args():
    import cutlass.cute as cute
    from cutlass import BFloat16

    rows = cute.sym_int()
    cols = cute.sym_int(divisibility=8)
    ts = []
    for _ in range(3):
        s = cute.sym_int64(divisibility=8)
        ts.append(cute.runtime.make_fake_tensor(BFloat16, (rows, cols), stride=(s, 1), assumed_align=16))
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return (*ts, stream)


def _compile_tvm_ffi(threads: int, vec: int, extra_options: str = ""):
    import cutlass.cute as cute

    host = _build(threads, vec)
    opts = "--enable-tvm-ffi" + (" " + extra_options if extra_options else "")
    return cute.compile(host, *_fake_args(), options=opts)


def _tag(threads: int, vec: int, arch: str) -> tuple[str, str]:
    from . import _cutlass_version, _source_hash

    src = _source_hash(("elementwise.py", "ptx.py"))  # ld_act_v4 lives in ptx.py
    tag = f"add_t{threads}_v{vec}_{arch}_{_cutlass_version()}_{src}"
    return "stradd_" + hashlib.sha256(tag.encode()).hexdigest()[:20], tag


def _compile(threads: int, vec: int, arch: str | None, use_disk: bool = True):
    from . import _device_arch, disk_cached

    arch = arch or _device_arch()
    fname, tag = _tag(threads, vec, arch)
    return disk_cached(fname, tag, lambda: _compile_tvm_ffi(threads, vec, extra_options=f"--gpu-arch {arch}"),
                       use_disk)


def get_add_kernel(threads: int, vec: int, arch: str | None = None):
    """Compiled TVM-FFI callable ``fn(a, b, out)`` (cached in process and on disk)."""
    from . import memoized

    return memoized(("add", threads, vec, arch), lambda: _compile(threads, vec, arch))


def compile_add_for_arch(threads: int = 128, vec: int = 1, arch: str = "sm_90a") -> str:
    """Compile without a GPU and return the PTX text."""
    from . import _lock as gemm_lock
    from . import ptx_of

    with _lock, gemm_lock:
        return ptx_of(lambda opts: _compile_tvm_ffi(threads, vec, extra_options=opts), arch)


# --------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------
def strided_add(a, b, out, config: tuple[int, int] | None = None):
    """out = a + b (bf16, 2-D, unit column stride, any row strides) on torch's current
    stream; returns ``out``. Raises ValueError for calls it cannot run (see supports_add)."""
    import torch

    if a.shape != b.shape or out.shape != a.shape:
        raise ValueError(f"shape mismatch: a {tuple(a.shape)} b {tuple(b.shape)} out {tuple(out.shape)}")
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t.dtype != torch.bfloat16:
            raise ValueError(f"{name} must be bfloat16, got {t.dtype}")
        if not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor")
    why = supports_add(tuple(out.shape), a.stride(), b.stride(), out.stride(), out.dtype)
    if why is not None:
        raise ValueError(f"strided_add unsupported: {why}")
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t.data_ptr() % 16:
            raise ValueError(f"{name} must be 16-byte aligned")
    rows, cols = out.shape
    if rows == 0:
        return out
    if rows == 1:  # a 1-row view may carry any row stride: give the kernel a valid one
        a, b, out_k = (t.as_strided((1, cols), (cols, 1)) for t in (a, b, out))
    else:
        out_k = out
    threads, vec = config or add_config(cols)
    get_add_kernel(threads, vec)(a, b, out_k)
    return out


def can_run(a, b, out) -> bool:
    """Run-time check used by the executor backend: True when strided_add takes this call."""
    import torch

    if out is None or a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16 or out.dtype != torch.bfloat16:
        return False
    if a.dim() != 2 or a.shape != b.shape or a.shape != out.shape:
        return False
    if not (a.is_cuda and b.is_cuda and out.is_cuda):
        return False
    if a.data_ptr() % 16 or b.data_ptr() % 16 or out.data_ptr() % 16:
        return False
    return supports_add(tuple(out.shape), a.stride(), b.stride(), out.stride(), out.dtype) is None
