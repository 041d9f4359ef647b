"""Two kernels that bound what any kernel launched like the fp8 skinny GEMM can reach, for
scripts/bench_launch_bound.py: the GEMM's ratio to the HBM floor is read against them.

- ``idle``: one warp that waits for the previous kernel (PDL), reads the first word of x and
  writes it. Its period in a graph of back-to-back calls is what a dependent launch costs with
  no work at all; no kernel that reads x can be faster.
- ``stream(StreamCfg)``: reads a weight's N * K bytes with 16-byte loads (L1 no-allocate, as the
  GEMM's weight loads), ``pre`` of each thread's loads issued before the PDL wait (weights do
  not depend on the previous kernel), reads the first word of x after it, and writes per warp the
  XOR of every 32-bit word it read. It has the GEMM's bytes, launch and dependency and none of
  its arithmetic: a reference for how near the floor streaming those bytes gets.
  ``rows`` 8 reads the same bytes in the GEMM lanes' pattern (8 rows x 64 bytes per warp load, a
  warp walking along its rows) instead of 512 contiguous bytes per warp load: what that pattern
  alone costs.

Both write checkable results (the XOR over all per-warp words is the XOR of the weight's words;
the last word is x's first), so the bench checks them before timing. Launched with PDL unless
StreamCfg.pdl is off; ``early`` triggers the next kernel's launch at the start (its blocks
become resident where an SM has room) instead of after the wait. Compiled like the other
families (TVM-FFI, environment stream, in-process and disk cache). Importing this module needs
neither cutlass nor a GPU.
"""


import dataclasses
import hashlib

SMS = 132  # H200 SMs: grids are multiples of it
MAX_PER = 96  # 16-byte loads per thread (the loop is unrolled)
MAX_PRE = 32  # of them held in registers across the wait (4 registers each)


@dataclasses.dataclass(frozen=True)
class StreamCfg:
    grid: int = SMS
    threads: int = 512
    pre: int = 8  # loads per thread issued before the PDL wait (capped at the thread's count)
    early: bool = False
    pdl: bool = True
    rows: int = 1  # 1: thread i's j-th load is vector i + j * grid * threads (a warp's load is 512
    # contiguous bytes); 8: the fp8 GEMM lanes' pattern, a warp's load is 64 bytes of each of 8
    # weight rows and its successive loads walk along those rows (see vector)

    def key(self) -> str:
        r = f"_r{self.rows}" if self.rows != 1 else ""
        return f"g{self.grid}_t{self.threads}_p{self.pre}_e{int(self.early)}_d{int(self.pdl)}{r}"

    def per(self, n: int, k: int) -> int:
        """16-byte loads per thread for an N x K fp8 weight."""
        v = n * k // 16
        return -(-v // (self.grid * self.threads))

    def check(self, n: int, k: int) -> str | None:
        """None if this config can stream an N x K fp8 weight, else why not."""
        if n <= 0 or k <= 0 or (n * k) % 16:
            return f"N * K = {n * k} bytes is not a positive multiple of 16"
        if self.grid <= 0 or self.threads <= 0 or self.threads % 32 or self.threads > 1024:
            return f"grid {self.grid} / threads {self.threads}: need grid > 0, threads a multiple of 32 <= 1024"
        if not 0 <= self.pre <= MAX_PRE:
            return f"pre {self.pre} is not in 0..{MAX_PRE}"
        if self.per(n, k) > MAX_PER:
            return f"{self.per(n, k)} loads per thread > {MAX_PER}: use a larger grid"
        if not self.pdl and (self.early or self.pre):
            return "early / pre need pdl"
        if self.rows not in (1, 8):
            return f"rows {self.rows} is not 1 or 8"
        if self.rows == 8 and (n % 8 or k % 64):
            return f"rows 8 needs N % 8 == 0 and K % 64 == 0 (N={n}, K={k})"
        return None


def vector(cfg: StreamCfg, n: int, k: int, gid, i, imin=min):
    """(16-byte vector index, inside the weight) of load i of thread gid, clamped to the last
    vector outside. rows 8: tile T = warp * per + i of 8 rows x 64 bytes (K / 64 tiles per 8
    rows, row-major), lane l reads row l // 4 of it, 16 bytes at (l % 4) * 16; so a warp walks
    along its 8 rows as a GEMM warp over its K range."""
    v = n * k // 16
    if cfg.rows == 1:
        idx = gid + i * (cfg.grid * cfg.threads)
        return imin(idx, v - 1), idx < v
    ct, kv, nt = k // 64, k // 16, v // 32
    t = imin((gid // 32) * cfg.per(n, k) + i, nt - 1)
    rb = t // ct
    lane = gid % 32
    return (rb * 8 + lane // 4) * kv + (t - rb * ct) * 4 + lane % 4, (gid // 32) * cfg.per(n, k) + i < nt


def stream_configs(n: int, k: int, rows: tuple[int, ...] = (1,)) -> list[StreamCfg]:
    """The bench's candidates: grid, threads, loads before the wait, trigger, for each load
    pattern in `rows`, and one without PDL."""
    out = []
    for r in rows:
        for g in (SMS, 2 * SMS, 4 * SMS):
            for t in (256, 512, 1024):
                for pre in (8, MAX_PRE):
                    for early in (False, True):
                        c = StreamCfg(g, t, pre, early, rows=r)
                        if c.check(n, k) is None and (pre <= c.per(n, k) or pre == 8):
                            out.append(c)
    if out:  # the first geometry again without PDL: what the dependent launch saves
        out.append(StreamCfg(out[0].grid, out[0].threads, 0, False, False))
    return list(dict.fromkeys(out))


# --------------------------------------------------------------------------------------
# kernels (cutlass imported only here)
# --------------------------------------------------------------------------------------
def _ops():
    from cutlass import Int32
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T, dsl_user_op

    @dsl_user_op
    def xor_warp(v: Int32, *, loc=None, ip=None):
        """XOR of v over the 32 lanes of the warp (butterfly shuffles)."""
        return Int32(llvm.inline_asm(
            T.i32(), [Int32(v).ir_value(loc=loc, ip=ip)],
            "{\n\t.reg .b32 s;\n\tmov.b32 $0, $1;\n\t"
            + "".join(f"shfl.sync.bfly.b32 s, $0, {d}, 0x1f, 0xffffffff;\n\txor.b32 $0, $0, s;\n\t"
                      for d in (16, 8, 4, 2, 1)) + "}",
            "=r,r", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))

    return xor_warp


def _build_stream(cfg: StreamCfg, n: int, k: int):
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64

    from .ptx import ld_act_v4, ld_weights_v4, pdl_wait

    xor_warp = _ops()
    G, TH = cfg.grid, cfg.threads
    PER = cfg.per(n, k)
    PRE = min(cfg.pre, PER)
    NWARP = G * TH // 32

    @cute.kernel
    def kernel(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        gid = bid * TH + tid
        base = mW.iterator.toint()
        if cutlass.const_expr(cfg.pdl and cfg.early):
            cute.arch.griddepcontrol_launch_dependents()
        held = []
        for i in cutlass.range_constexpr(PRE):
            idx, _ = vector(cfg, n, k, gid, i, cutlass.min)
            held.append(ld_weights_v4(base + Int64(idx) * 16))
        if cutlass.const_expr(cfg.pdl):
            pdl_wait(tid)
            if cutlass.const_expr(not cfg.early):
                cute.arch.griddepcontrol_launch_dependents()
        xw = ld_act_v4(mX.iterator.toint())[0]  # x is the previous kernel's output
        acc = Int32(0)
        for i in cutlass.range_constexpr(PER):
            idx, inside = vector(cfg, n, k, gid, i, cutlass.min)
            v = held[i] if i < PRE else ld_weights_v4(base + Int64(idx) * 16)
            keep = Int32(0) - Int32(inside)  # all ones for a load inside the weight
            acc = acc ^ ((v[0] ^ v[1] ^ v[2] ^ v[3]) & keep)
        acc = xor_warp(acc)
        if tid % 32 == 0:
            mO[gid // 32] = acc
        if gid == 0:
            mO[NWARP] = xw

    @cute.jit
    def host(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, stream):
        kernel(mX, mW, mO).launch(grid=(G, 1, 1), block=(TH, 1, 1), stream=stream, use_pdl=cfg.pdl)

    return host


def _build_idle(pdl: bool):
    import cutlass
    import cutlass.cute as cute

    from .ptx import ld_act_v4, pdl_wait

    @cute.kernel
    def kernel(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        if cutlass.const_expr(pdl):
            cute.arch.griddepcontrol_launch_dependents()
            pdl_wait(tid)
        xw = ld_act_v4(mX.iterator.toint())[0]
        if tid == 0:
            mO[0] = xw

    @cute.jit
    def host(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, stream):
        kernel(mX, mW, mO).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream, use_pdl=pdl)

    return host


def _fake_args(n: int | None, k: int | None):
    """n, k None (the idle kernel): x and w of any shape."""
    import cutlass.cute as cute
    from cutlass import Int32, Uint8

    m = cute.sym_int()
    kx = cute.sym_int() if k is None else k
    x = cute.runtime.make_fake_tensor(Uint8, (m, kx), stride=(cute.sym_int64(divisibility=16), 1),
                                      assumed_align=16)
    if n is None:
        w = cute.runtime.make_fake_tensor(Uint8, (cute.sym_int(), cute.sym_int()), stride=(cute.sym_int64(), 1),
                                          assumed_align=16)
    else:
        w = cute.runtime.make_fake_tensor(Uint8, (n, k), stride=(k, 1), assumed_align=16)
    out = cute.runtime.make_fake_tensor(Int32, (cute.sym_int(),), stride=(1,), assumed_align=4)
    return x, w, out, cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)


def _what(cfg: StreamCfg | None, pdl: bool) -> str:
    return f"idle_d{int(pdl)}" if cfg is None else f"stream_{cfg.key()}"


def _compile_tvm_ffi(cfg: StreamCfg | None, n: int, k: int, pdl: bool, extra_options: str = ""):
    import cutlass.cute as cute

    if cfg is not None:
        why = cfg.check(n, k)
        if why is not None:
            raise ValueError(f"stream config {cfg.key()} cannot stream N={n} K={k}: {why}")
    host = _build_idle(pdl) if cfg is None else _build_stream(cfg, n, k)
    opts = "--enable-tvm-ffi" + (" " + extra_options if extra_options else "")
    return cute.compile(host, *(_fake_args(n, k) if cfg is not None else _fake_args(None, None)), options=opts)


def _compile(cfg: StreamCfg | None, n: int, k: int, pdl: bool, arch: str | None, use_disk: bool = True):
    from . import _cutlass_version, _device_arch, _source_hash, disk_cached

    arch = arch or _device_arch()
    if cfg is None:
        n = k = 128
    tag = f"{_what(cfg, pdl)}_n{n}_k{k}_{arch}_{_cutlass_version()}_{_source_hash(('bound.py', 'ptx.py'))}"
    fname = "bound_" + hashlib.sha256(tag.encode()).hexdigest()[:20]
    return disk_cached(fname, tag, lambda: _compile_tvm_ffi(cfg, n, k, pdl, f"--gpu-arch {arch}"), use_disk)


def get_kernel(cfg: StreamCfg | None, n: int, k: int, pdl: bool = True, arch: str | None = None):
    """Compiled ``fn(x_u8, w_u8, out_i32)``: the stream kernel for cfg and an N x K weight, or with
    cfg None the idle kernel (any weight; pdl chooses its launch)."""
    from . import memoized

    key = ("bound", cfg, n, k, pdl, arch) if cfg is not None else ("bound", None, pdl, arch)
    return memoized(key, lambda: _compile(cfg, n, k, pdl, arch))


def compile_for_arch(cfg: StreamCfg | None, n: int, k: int, pdl: bool = True, arch: str = "sm_90a") -> str:
    """Compile without a GPU and return the PTX text."""
    from . import _lock, ptx_of

    with _lock:
        return ptx_of(lambda opts: _compile_tvm_ffi(cfg, n, k, pdl, extra_options=opts), arch)


def out_words(cfg: StreamCfg | None) -> int:
    """Length of the int32 output the kernel writes."""
    return 1 if cfg is None else cfg.grid * cfg.threads // 32 + 1


def sass_for_arch(cfg: StreamCfg | None, n: int, k: int, pdl: bool = True, arch: str = "sm_90a") -> str:
    """Compile without a GPU and return the SASS text (nvdisasm)."""
    from . import sass_of

    return sass_of(lambda opts: _compile_tvm_ffi(cfg, n, k, pdl, extra_options=opts), arch)
