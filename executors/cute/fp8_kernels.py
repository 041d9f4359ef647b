"""The fp8 skinny-GEMM kernel (imports cutlass: load lazily, see fp8.py for the API and math).

Per lane (g = lane / 4, t = lane % 4) and 64-wide K step: one 16-byte non-coherent load of weight
row g of each n8 tile (columns t*16 .. t*16+16 of the step) and one 16-byte load of x rows g and
g + 8 at the same columns. 32-bit word j of these vectors is converted to two f16x2 registers and
feeds the j-th m16n8k16 mma of the step as (a0, a2) / (a1, a3) of x and (b0, b1) of the weights,
so x and the weights see the same K permutation (which bytes a register holds depends on the
conversion, see fp8.word_byte_order, and is the same for both operands). Two such steps make a
128-wide K block: its partial sums are promoted into the accumulator with the block's scales.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, Uint8
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .fp8_config import Fp8Config, bits_ptx
from .fp8_lane import LaneProgram, acc_entries
from .fp8_wg import WgProgram
from .fp8_wgr import WgrProgram
from .kernels import _imin, _SmemAllocator
from .ptx import (
    bulk_g2s,
    ld_act_v4,
    ld_shared_v4,
    ld_weights_v4,
    mbar_expect_tx,
    mbar_init,
    mbar_init_fence,
    mbar_wait,
    pdl_wait,
    prefetch_l2_bulk,
    stamp_record,
    sync_warp,
)
from .ptx_wg import (
    bar_wg,
    cluster_arrive,
    cluster_sync,
    cluster_wait,
    cp_async16,
    cp_commit,
    cp_wait,
    fence_async,
    fence_regs,
    keep_regs,
    ld_cluster_f32,
    ld_smem32,
    make_desc,
    pass_regs,
    st_smem32,
    wg_commit,
    wg_fence,
    wg_wait,
    wgmma_e4m3,
)


# --------------------------------------------------------------------------------------
# inline PTX
# --------------------------------------------------------------------------------------
def _words(res, n):
    return [Int32(llvm.extractvalue(T.i32(), res, [i])) for i in range(n)]


@dsl_user_op
def cvt_hw(q: Int32, *, loc=None, ip=None):
    """Hardware conversion of 4 e4m3 values: [f16x2 (b0, b1), f16x2 (b2, b3)]."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 2), [Int32(q).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, $2;\n\t"
        "cvt.rn.f16x2.e4m3x2 $0, lo;\n\tcvt.rn.f16x2.e4m3x2 $1, hi;\n\t}",
        "=r,=r,r", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT)
    return _words(res, 2)


@dsl_user_op
def cvt_bits(q: Int32, *, loc=None, ip=None):
    """Integer conversion of 4 e4m3 values, 2^-8 times exact: [f16x2 (b0, b2), f16x2 (b1, b3)]
    (fp8.BITS_PROGRAM, rendered by fp8.bits_ptx)."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 2), [Int32(q).ir_value(loc=loc, ip=ip)],
        bits_ptx(), "=&r,=&r,r", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT)
    return _words(res, 2)


@dsl_user_op
def mma_f16(a, b, c, *, loc=None, ip=None):
    """One m16n8k16 f16 mma.sync with fp32 accumulation: a 4 x f16x2, b 2 x f16x2, c 4 x f32."""
    ops = [Int32(v).ir_value(loc=loc, ip=ip) for v in list(a) + list(b)]
    ops += [Float32(v).ir_value(loc=loc, ip=ip) for v in c]
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32()] * 4), ops,
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT)
    return [Float32(llvm.extractvalue(T.f32(), res, [i])) for i in range(4)]


def _ld_f32(instr: str, addr, loc, ip):
    return Float32(llvm.inline_asm(
        T.f32(), [Int64(addr).ir_value(loc=loc, ip=ip)], instr + " $0, [$1];", "=f,l",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def ld_f32(addr: Int64, *, loc=None, ip=None):
    """Coherent fp32 load (activation scales, written by the previous kernel)."""
    return _ld_f32("ld.global.f32", addr, loc, ip)


@dsl_user_op
def ld_f32_nc(addr: Int64, *, loc=None, ip=None):
    """Non-coherent fp32 load (weight scales, read-only)."""
    return _ld_f32("ld.global.nc.f32", addr, loc, ip)


class _Ops:
    """LaneProgram's ops as CuTe DSL values and inline PTX."""

    Int32, Int64, Float32 = Int32, Int64, Float32
    imin = staticmethod(_imin)
    ld_w = staticmethod(ld_weights_v4)
    ld_x = staticmethod(ld_act_v4)
    ld_f32 = staticmethod(ld_f32)
    ld_f32_nc = staticmethod(ld_f32_nc)
    cvt_hw = staticmethod(cvt_hw)
    cvt_bits = staticmethod(cvt_bits)
    mma = staticmethod(mma_f16)
    ld_smem = staticmethod(ld_shared_v4)
    mbar_init = staticmethod(mbar_init)
    mbar_init_fence = staticmethod(mbar_init_fence)
    expect_tx = staticmethod(mbar_expect_tx)
    bulk = staticmethod(bulk_g2s)
    mbar_wait = staticmethod(mbar_wait)
    sync_warp = staticmethod(sync_warp)
    prefetch_l2 = staticmethod(prefetch_l2_bulk)
    # the warpgroup program (WgProgram)
    cp_async = staticmethod(cp_async16)
    cp_commit = staticmethod(cp_commit)
    cp_wait = staticmethod(cp_wait)
    fence_async = staticmethod(fence_async)
    bar_wg = staticmethod(bar_wg)
    wg_fence = staticmethod(wg_fence)
    wg_commit = staticmethod(wg_commit)
    wg_wait = staticmethod(wg_wait)
    wgmma = staticmethod(wgmma_e4m3)
    make_desc = staticmethod(make_desc)
    fence_regs = staticmethod(fence_regs)
    ld_smem32 = staticmethod(ld_smem32)
    keep_regs = staticmethod(keep_regs)
    st_smem32 = staticmethod(st_smem32)
    pass_regs = staticmethod(pass_regs)


@cute.jit
def _tl_stamp(mT: cute.Tensor, tid, bid, slot: cutlass.Constexpr):
    """Fp8Config.timeline: thread 0 stores %globaltimer into slot `slot` of block bid's 64-byte
    record (0 start, 1 weights issued, 2 past the PDL wait, 3 end; slot 7 its SM id)."""
    if tid == 0:
        stamp_record(Int64(mT.iterator.toint()) + Int64(bid) * 64, slot, 7)


# --------------------------------------------------------------------------------------
# epilogue (plain Python traced inside the kernel; the predicated stores are jit helpers)
# --------------------------------------------------------------------------------------
class _Out:
    """What every epilogue store needs: the output and its bounds, the program (final scales,
    output coordinates), the block's tile and thread, outputs per block."""

    def __init__(self, mO, m_rows, n, out_t, ln, tile, tid, nthr, out_blk):
        self.mO, self.m_rows, self.n, self.out_t, self.ln = mO, m_rows, n, out_t, ln
        self.tile, self.tid, self.nthr, self.out_blk = tile, tid, nthr, out_blk

    def value(self, s, m, col):
        """Output value of token m, column col from its sum (scales read at clamped coordinates)."""
        return self.ln.final(s, _imin(m, self.m_rows - 1), _imin(col, self.n - 1)).to(self.out_t)


@cute.jit
def _store_at(mO: cute.Tensor, m, col, v, m_lim, n: cutlass.Constexpr):
    if m < m_lim:
        if col < n:
            mO[m, col] = v


@cute.jit
def _store_at_if(mO: cute.Tensor, ok, m, col, v, m_lim, n: cutlass.Constexpr):
    if ok:
        _store_at(mO, m, col, v, m_lim, n)


def _store_wgr(out: _Out, acc, g, t, n_tile0):
    """wgr with one warpgroup and no cluster: each thread stores its fragment's values."""
    for e, m, row in out.ln.entries(g, t):
        col = n_tile0 + row
        _store_at(out.mO, m, col, out.value(acc[e], m, col), out.m_rows, out.n)


def _store_lane(out: _Out, cfg: Fp8Config, acc, g, t, n_tile0, warp):
    """warps_k 1 (lane or wg program): each lane stores its accumulators. wg: only warp 0 of
    the warpgroup holds token rows (the others, wgmma rows 16..63)."""
    ents = acc_entries(cfg.tiles, cfg.m_tile, g, t)
    m_lim = out.m_rows * Int32(warp % 4 == 0) if cfg.wg else out.m_rows
    for r, e, m, c8 in ents:
        col = n_tile0 + r * 8 + c8
        _store_at(out.mO, m, col, out.value(acc[r][e], m, col), m_lim, out.n)


def _to_smem(out: _Out, smem, cfg: Fp8Config, acc, g, t, wk, wn, warp):
    """Every warp's (wgr: warpgroup's) partial sums into the shared-memory reduction buffer (wg:
    warps 1..3 of a warpgroup write a second, never-read half instead); the caller syncs."""
    wkn = cfg.warps_k
    ents = out.ln.entries(g, t) if cfg.wgr else acc_entries(cfg.tiles, cfg.m_tile, g, t)
    red = _alloc_f32(smem, (2 if cfg.wg else 1) * wkn * out.out_blk)
    if cfg.wgr:
        for e, m, row in ents:
            red[out.ln.red_slot(wk, row, m)] = acc[e]
    else:
        junk = Int32(warp % 4 != 0) * (wkn * out.out_blk) if cfg.wg else 0
        for r, e, m, c8 in ents:
            red[out.ln.red_slot(wk, wn, r, m, c8) + junk] = acc[r][e]
    return red


def _alloc_f32(smem, words: int):
    return smem.allocate_tensor(Float32, cute.make_layout(words), byte_alignment=16)


def _block_sum(red, wk: int, out_blk: int, idc):
    s = Float32(0.0)
    for q in range(wk):
        s = s + red[q * out_blk + idc]
    return s


def _block_passes(out: _Out, red, wk: int):
    """Per pass of the block's threads over its outputs: (output idx, idx clamped to the block,
    the sum of its warps_k partials); the caller stores each pass before the next is summed."""
    for p in range((out.out_blk + out.nthr - 1) // out.nthr):
        idx = out.tid + p * out.nthr
        idc = _imin(idx, out.out_blk - 1)
        yield idx, idc, _block_sum(red, wk, out.out_blk, idc)


def _store_block_sums(out: _Out, red, wk: int):
    """Each thread sums output idx over the warps_k partials and stores it."""
    for idx, idc, s in _block_passes(out, red, wk):
        m, col = out.ln.out_coord(out.tile, idc)
        _store_at_if(out.mO, idx < out.out_blk, m, col, out.value(s, m, col), out.m_rows, out.n)


def _store_cluster_share(out: _Out, smem, red, wk: int, ks: int, rank):
    """wgr clusters: the block's sums into shared memory, then each block finishes its share of
    the tile from every block's sums (distributed shared memory) and stores it."""
    part = _alloc_f32(smem, out.out_blk)
    for idx, idc, s in _block_passes(out, red, wk):
        _put_if(part, idx < out.out_blk, idc, s)
    cluster_sync()
    part_at = Int32(part.iterator.toint())
    sh = out.ln.share
    sums = []
    for j, idx in out.ln.share_slots(rank, out.tid, out.nthr):
        s = Float32(0.0)
        for q in range(ks):
            s = s + ld_cluster_f32(part_at + idx * 4, Int32(q))
        sums.append((j, idx, s))
    # done reading the other blocks' sums: arrive before the stores, so the barrier's release
    # does not wait for them; no block leaves before every block has arrived
    cluster_arrive()
    for j, idx, s in sums:
        m, col = out.ln.out_coord(out.tile, idx)
        _store_at_if(out.mO, j < sh, m, col, out.value(s, m, col), out.m_rows, out.n)
    cluster_wait()


@cute.jit
def _put_if(t: cute.Tensor, ok, i, v):
    if ok:
        t[i] = v


# --------------------------------------------------------------------------------------
# kernel
# --------------------------------------------------------------------------------------
def build(cfg: Fp8Config, n: int, k: int, a: int, b: int, o: int):
    """Host function for out = (x * sa) @ (w * sb)^T; a, b: scale kinds (0 tensor, 1 row/col,
    2 block), o: 0 bf16 out, 1 fp32 out."""
    MT, R, WN, WK = cfg.m_tile, cfg.tiles, cfg.warps_n, cfg.warps_k
    NTHR = cfg.threads()
    GRID = cfg.grid(n)
    OUT_BLK = 64 * MT if cfg.wgr else WN * R * MT * 8
    KS = cfg.ks
    PDL = cfg.pdl
    N, K = n, k
    OUT_T = Float32 if o == 1 else BFloat16
    attrs = {}
    if cfg.minb > 0:
        # an explicit carveout keeps the DSL from asking a device for its smem size (CPU compile)
        attrs = {"min_blocks_per_mp": cfg.minb, "preferred_smem_carveout": -1}

    @cute.jit
    def body(mX: cute.Tensor, mW: cute.Tensor, mSA: cute.Tensor, mSB: cute.Tensor, mO: cute.Tensor,
             tl: cutlass.Constexpr):
        """The kernel (traced into either entry below); tl: the timeline tensor or None."""
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        if cutlass.const_expr(tl is not None):
            _tl_stamp(tl, tid, bid, 0)
        lane = tid % 32
        warp = tid // 32
        g = lane // 4
        t = lane % 4
        wn = warp % WN
        wk = warp // WN
        if cutlass.const_expr(cfg.wg or cfg.wgr):  # warps_k counts warpgroups (warps_n is 1)
            wk = warp // 4
        n_tile0 = (bid * WN + wn) * (8 * R)
        rank = 0
        tile = bid
        if cutlass.const_expr(cfg.wgr):
            tile, rank = bid // KS, bid % KS  # a cluster's blocks are consecutive
            n_tile0 = tile * 64
            g = g + 16 * (warp % 4)  # the thread's row in the 64-row tile

        if cutlass.const_expr(PDL and cfg.early):
            # the next kernel may launch at once: its blocks become resident beside this grid's
            # where an SM has room and load their weights while this one runs
            cute.arch.griddepcontrol_launch_dependents()
        ln = (WgrProgram if cfg.wgr else WgProgram if cfg.wg else LaneProgram)(_Ops, cfg, N, K, a, b)
        if cutlass.const_expr(cfg.wgr):
            ln.setup_weights(mW.iterator.toint(), n_tile0, g, t, wk, mSB.iterator.toint(),
                             mSB.stride[0], mSB.stride[1], rank)
        else:
            ln.setup_weights(mW.iterator.toint(), n_tile0, g, t, wk, mSB.iterator.toint(),
                             mSB.stride[0], mSB.stride[1])
        smem = _SmemAllocator()
        if cutlass.const_expr(cfg.bulk > 0 and not cfg.wg):
            nw = WN * WK
            ring = smem.allocate_tensor(Int32, cute.make_layout(nw * cfg.bulk * cfg.bulk_stage_bytes() // 4),
                                        byte_alignment=128)
            bars = smem.allocate_tensor(Int64, cute.make_layout(nw * cfg.bulk), byte_alignment=8)
            ln.setup_bulk(Int32(ring.iterator.toint()), Int32(bars.iterator.toint()), warp, lane, g, t)
        if cutlass.const_expr(cfg.wg):
            # the program's own stage size (weights and x rows), so the two cannot disagree
            ring = smem.allocate_tensor(Int32, cute.make_layout(WK * cfg.bulk * ln.stage_bytes // 4),
                                        byte_alignment=128)
            ln.setup_wg(Int32(ring.iterator.toint()), tid % 128, wk + 1)
        if cutlass.const_expr(cfg.wgr):
            xs = smem.allocate_tensor(Int32, cute.make_layout(WK * cfg.wgr_x_bytes() // 4), byte_alignment=128)
            ln.setup_wg(Int32(xs.iterator.toint()), tid % 128, wk + 1)
        pre = ln.preload()
        if cutlass.const_expr(tl is not None):
            _tl_stamp(tl, tid, bid, 1)
        if cutlass.const_expr(PDL):
            pdl_wait(tid)
            if cutlass.const_expr(not cfg.early):
                # let the next kernel launch now: it loads its own weights, then waits for this grid
                cute.arch.griddepcontrol_launch_dependents()
        if cutlass.const_expr(tl is not None):
            _tl_stamp(tl, tid, bid, 2)
        m_rows = mX.shape[0]
        ln.setup_acts(mX.iterator.toint(), mX.stride[0], m_rows, g, t, mSA.iterator.toint(),
                      mSA.stride[0], mSA.stride[1])
        acc = ln.run(pre)

        # outputs are computed for clamped coordinates (valid loads of the row / column scales)
        # and stored under the predicate: the predicated regions hold stores only
        out = _Out(mO, m_rows, N, OUT_T, ln, tile, tid, NTHR, OUT_BLK)
        if cutlass.const_expr(cfg.wgr and WK == 1 and KS == 1):
            _store_wgr(out, acc, g, t, n_tile0)
        elif cutlass.const_expr(WK == 1 and not cfg.wgr):
            _store_lane(out, cfg, acc, g, t, n_tile0, warp)
        else:
            red = _to_smem(out, smem, cfg, acc, g, t, wk, wn, warp)
            cute.arch.sync_threads()
            if cutlass.const_expr(KS == 1):
                _store_block_sums(out, red, WK)
            else:
                _store_cluster_share(out, smem, red, WK, KS, rank)
        if cutlass.const_expr(tl is not None):
            cute.arch.sync_threads()  # the end: every warp of the block is past its stores
            _tl_stamp(tl, tid, bid, 3)

    @cute.kernel
    def kernel(mX: cute.Tensor, mW: cute.Tensor, mSA: cute.Tensor, mSB: cute.Tensor,
               mO: cute.Tensor):
        body(mX, mW, mSA, mSB, mO, None)

    @cute.kernel
    def kernel_tl(mX: cute.Tensor, mW: cute.Tensor, mSA: cute.Tensor, mSB: cute.Tensor,
                  mO: cute.Tensor, mT: cute.Tensor):
        body(mX, mW, mSA, mSB, mO, mT)

    launch = dict(grid=(GRID, 1, 1), block=(NTHR, 1, 1), use_pdl=PDL, **attrs)
    if cfg.ks > 1:
        launch["cluster"] = [cfg.ks, 1, 1]
    if cfg.timeline:
        @cute.jit
        def host_tl(mX: cute.Tensor, mW: cute.Tensor, mSA: cute.Tensor, mSB: cute.Tensor,
                    mO: cute.Tensor, mT: cute.Tensor, stream):
            kernel_tl(mX, mW, mSA, mSB, mO, mT).launch(stream=stream, **launch)

        return host_tl

    @cute.jit
    def host(mX: cute.Tensor, mW: cute.Tensor, mSA: cute.Tensor, mSB: cute.Tensor,
             mO: cute.Tensor, stream):
        kernel(mX, mW, mSA, mSB, mO).launch(stream=stream, **launch)

    return host


def fake_args(n: int, k: int, o: int, timeline: bool = False):
    """Fake tensors / stream for TVM-FFI compilation: M, the row strides of x and out, the
    scales' shapes and strides are runtime values. x and w are passed as uint8 views."""
    m = cute.sym_int()
    x = cute.runtime.make_fake_tensor(Uint8, (m, k), stride=(cute.sym_int64(divisibility=16), 1),
                                      assumed_align=16)
    w = cute.runtime.make_fake_tensor(Uint8, (n, k), stride=(k, 1), assumed_align=16)
    scales = [cute.runtime.make_fake_tensor(Float32, (cute.sym_int(), cute.sym_int()),
                                            stride=(cute.sym_int64(), cute.sym_int64()),
                                            assumed_align=4) for _ in range(2)]
    out_t = Float32 if o == 1 else BFloat16
    out = cute.runtime.make_fake_tensor(out_t, (m, n), stride=(cute.sym_int64(), 1),
                                        assumed_align=4 if o == 1 else 2)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    if timeline:  # 8 int64 words per block
        tl = cute.runtime.make_fake_tensor(Int64, (cute.sym_int(),), stride=(1,), assumed_align=8)
        return x, w, scales[0], scales[1], out, tl, stream
    return x, w, scales[0], scales[1], out, stream


def compile_tvm_ffi(cfg: Fp8Config, n: int, k: int, a: int, b: int, o: int,
                    extra_options: str = ""):
    why = cfg.check(1, n, k)
    if why is not None:
        raise ValueError(f"config {cfg.key()} cannot compile N={n} K={k}: {why}")
    host = build(cfg, n, k, a, b, o)
    opts = "--enable-tvm-ffi" + (" " + extra_options if extra_options else "")
    return cute.compile(host, *fake_args(n, k, o, cfg.timeline), options=opts)
