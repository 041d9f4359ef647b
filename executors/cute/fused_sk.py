"""Fused KDA step with a split-K F_A/beta prologue (config knob ``sk=1``; imports cutlass).

Same outputs as ``kernels.build_fused`` (out = x @ w^T over the packed weight, g1 = f_a @ w_fb^T),
different schedule. The timeline of the plain fused kernel (results/kda_kernels/
2026-11-30_h200_run12_to_run18.md) shows its f_a producer tiles finish with every other tile, at the
end of the one-wave grid, so F_B runs after the stream. Here the F_A/beta rows are read FIRST, by
everybody at once:

* the F_A/beta rows [a0, n) are TJ n8 tiles x CH chunks of WK 32-wide K steps = UNITS units;
* every block has one warp more than its streaming warps; in streaming block b (b < T_S, the tiles
  of rows [0, a0)) that helper warp computes unit b alone (8 weight vectors per lane, in two
  halves), stores the fp32 partial and publishes it (release add on counter A), while the
  streaming warps run exactly as in build_fused; the release fence therefore never stalls a
  streaming warp, and the grid stays T_S + C blocks (one wave at 3 blocks/SM for Kimi-K3);
* the consumer blocks' warps compute the remaining units the same way, wait until A counts them all,
  sums the CH partials of its share of the TJ tiles into bf16 columns of ``out`` (counter B), waits
  until B counts every tile, then runs F_B from f_a read back through L2 (as build_fused does).

Both counters reset themselves (the last consumer arrival zeroes each), so graph replays need no
memset. Workspace layout (int32 units): [0] counter A, [1] counter B, partials (fp32) from byte 64.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .config import Config, sk_geometry
from .kernels import (
    _SmemAllocator,
    _imin,
    _launch_attrs,
    _weight_addrs,
    fake_args_fused,
    fence_acq_rel_gpu,
    ld_act_v4,
    ld_l2_v4,
    ld_weights_v4,
    mma_k32,
    red_add_release_gpu,
    wait_then_arrive,
)

SKS = 8  # 32-wide K steps per unit (one helper warp, two halves of 4)


@dsl_user_op
def st_f32(addr: Int64, val: Float32, *, loc=None, ip=None):
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Float32(val).ir_value(loc=loc, ip=ip)],
                    "st.global.f32 [$0], $1;", "l,f", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def ld_cg_f32(addr: Int64, *, loc=None, ip=None):
    """fp32 load through L2 (written by other blocks of this grid)."""
    return Float32(llvm.inline_asm(T.f32(), [Int64(addr).ir_value(loc=loc, ip=ip)],
                                   "ld.global.cg.f32 $0, [$1];", "=f,l", has_side_effects=True,
                                   is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


def _load_xs(xg_row, xh_row, off, mt: int):
    """mma A fragment of x rows (g, g + 8) at byte offset off (traced helper, plain Python)."""
    xg = ld_act_v4(xg_row + off)
    xh = ld_act_v4(xh_row + off) if mt == 16 else [Int32(0)] * 4
    return [xg[0], xh[0], xg[1], xh[1], xg[2], xh[2], xg[3], xh[3]]


def _unit_partial(u, w_base, xg_row, xh_row, scr, g, t, a0: int, k: int, ch: int, mt: int):
    """One warp: the fp32 partial of unit u (n8 tile u // ch of the rows from a0, 32-wide K steps
    (u % ch) * SKS ...) stored to the scratch (caller publishes it)."""
    pv = mt * 8
    wrow = w_base + Int64(a0 + (u // ch) * 8 + g) * (k * 2) + Int64(t * 16)
    s0 = (u % ch) * SKS
    acc = [Float32(0.0)] * 4
    for hf in range(2):  # two halves of 4 steps: 16 weight + 16/32 x registers in flight
        ws = [ld_weights_v4(wrow + Int64((s0 + hf * 4 + q) * 64)) for q in range(4)]
        xs = [_load_xs(xg_row, xh_row, Int64((s0 + hf * 4 + q) * 64), mt) for q in range(4)]
        for q in range(4):
            acc = mma_k32(xs[q], ws[q], acc)
    for h in range(mt // 8):
        for e in range(2):
            st_f32(scr + (Int64(u) * pv + Int64((g + 8 * h) * 8 + 2 * t + e)) * 4, acc[2 * h + e])


def build_fused_sk(cfg: Config, n: int, k: int, a0: int, nb: int, kb: int):
    MT = cfg.m_tile
    R = cfg.tiles
    WK = cfg.warps_k
    NW = WK + 1  # streaming warps + the helper warp
    U = cfg.unroll
    RB = cfg.fb_tiles
    FP = cfg.fb_passes
    SB = kb // 32
    STEPS = k // 32
    JW = STEPS // WK
    NIT = JW // U
    NTHR = 32 * NW
    OUT_BLK = R * MT * 8
    PV = MT * 8  # values of one unit's partial
    T_S, TJ, CH, UNITS, C, UC = sk_geometry(cfg, n, k, a0, nb, kb)
    GRID = T_S + C
    PDL = cfg.pdl
    SPAD = cfg.spad
    N = n
    K = k
    NB = nb
    KB = kb
    A0 = a0

    @cute.kernel
    def kernel(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, mWB: cute.Tensor,
               mG: cute.Tensor, mC: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        lane = tid % 32
        warp = tid // 32
        g = lane // 4
        t = lane % 4
        m_rows = mX.shape[0]
        smem = _SmemAllocator()
        red = smem.allocate_tensor(Float32, cute.make_layout(WK * OUT_BLK), byte_alignment=16)
        if cutlass.const_expr(SPAD > 0):  # unused: only caps how many blocks share an SM
            smem.allocate_tensor(Float32, cute.make_layout(SPAD * 256), byte_alignment=16)
        ctr_a = mC.iterator.toint()
        ctr_b = ctr_a + Int64(4)
        scr = ctr_a + Int64(64)
        so = mO.stride[0]
        sx = mX.stride[0]
        w_base = mW.iterator.toint()
        x_base = mX.iterator.toint()
        xg_row = x_base + Int64(_imin(g, m_rows - 1)) * Int64(sx) * 2 + Int64(t * 16)
        xh_row = x_base + Int64(_imin(g + 8, m_rows - 1)) * Int64(sx) * 2 + Int64(t * 16)

        if bid < T_S:
            # ---------- streaming block: WK warps stream the QKVG tile, the helper does unit bid ----------
            n_tile0 = bid * (8 * R)
            if warp < WK:
                wk = warp
                w_addr = _weight_addrs(w_base, n_tile0, g, t, lane, wk * JW, R, N, K, 0)

                def load_w(it):
                    regs = []
                    for u in cutlass.range_constexpr(U):
                        for r in cutlass.range_constexpr(R):
                            regs.append(ld_weights_v4(w_addr[r] + Int64((it * U + u) * 64)))
                    return regs

                w_cur = load_w(0)
                if cutlass.const_expr(PDL):
                    cute.arch.griddepcontrol_wait()
                    cute.arch.griddepcontrol_launch_dependents()
                koff = Int64(wk * JW * 64)

                def load_x(it):
                    return [_load_xs(xg_row, xh_row, koff + Int64((it * U + u) * 64), MT) for u in range(U)]

                x_cur = load_x(0)
                acc = [[Float32(0.0)] * 4 for _ in range(R)]
                for it in cutlass.range_constexpr(NIT):
                    if cutlass.const_expr(it + 1 < NIT):
                        w_nxt = load_w(it + 1)
                        x_nxt = load_x(it + 1)
                    for u in cutlass.range_constexpr(U):
                        for r in cutlass.range_constexpr(R):
                            acc[r] = mma_k32(x_cur[u], w_cur[u * R + r], acc[r])
                    if cutlass.const_expr(it + 1 < NIT):
                        w_cur = w_nxt
                        x_cur = x_nxt
                for r in cutlass.range_constexpr(R):
                    for h in cutlass.range_constexpr(MT // 8):
                        for e in cutlass.range_constexpr(2):
                            idx = (wk * R + r) * (MT * 8) + (g + 8 * h) * 8 + 2 * t + e
                            red[idx] = acc[r][2 * h + e]
            else:
                if cutlass.const_expr(PDL):
                    cute.arch.griddepcontrol_wait()
                    cute.arch.griddepcontrol_launch_dependents()
                _unit_partial(bid, w_base, xg_row, xh_row, scr, g, t, A0, K, CH, MT)
                cute.arch.sync_warp()
                if lane == 0:
                    red_add_release_gpu(ctr_a, Int32(1))
            cute.arch.sync_threads()
            for p in cutlass.range_constexpr((OUT_BLK + NTHR - 1) // NTHR):
                idx = tid + p * NTHR
                if idx < OUT_BLK:
                    s = Float32(0.0)
                    for q in cutlass.range_constexpr(WK):
                        s = s + red[q * OUT_BLK + idx]
                    m = (idx // 8) % MT
                    col = n_tile0 + (idx // (8 * MT)) * 8 + idx % 8
                    if m < m_rows:
                        if col < N:
                            mO[m, col] = s.to(BFloat16)
        else:
            # ---------- consumer: UC units over its NW warps, tile sums, then F_B ----------
            cb = bid - T_S
            if cutlass.const_expr(PDL):
                cute.arch.griddepcontrol_wait()
                cute.arch.griddepcontrol_launch_dependents()
            for rnd in cutlass.range_constexpr((UC + NW - 1) // NW):
                i = rnd * NW + warp
                if i < UC:
                    _unit_partial(T_S + cb * UC + i, w_base, xg_row, xh_row, scr, g, t, A0, K, CH, MT)
                    cute.arch.sync_warp()
                    if lane == 0:
                        red_add_release_gpu(ctr_a, Int32(1))
            if tid == 0:  # every unit published?
                wait_then_arrive(ctr_a, Int32(UNITS), Int32(UNITS + C))
            cute.arch.sync_threads()
            for jj in cutlass.range_constexpr((TJ + C - 1) // C):
                j = cb + jj * C
                if j < TJ:
                    for q in cutlass.range_constexpr((PV + NTHR - 1) // NTHR):
                        idx = tid + q * NTHR
                        if idx < PV:
                            parts = [ld_cg_f32(scr + (Int64(j * CH + c) * PV + Int64(idx)) * 4)
                                     for c in range(CH)]
                            s = Float32(0.0)
                            for v in parts:
                                s = s + v
                            m = idx // 8
                            if m < m_rows:
                                mO[m, A0 + j * 8 + idx % 8] = s.to(BFloat16)
            fence_acq_rel_gpu()
            cute.arch.sync_threads()
            if tid == 0:  # publish this block's tiles, wait for all of them
                red_add_release_gpu(ctr_b, (TJ - cb + C - 1) // C)
                wait_then_arrive(ctr_b, Int32(TJ), Int32(TJ + C))
            cute.arch.sync_threads()
            if warp < WK:  # F_B: g1 = f_a @ w_fb^T, f_a read back from out through L2
                row0 = (cb * WK + warp) * (8 * RB * FP)
                wb_base = mWB.iterator.toint()
                o_base = mO.iterator.toint() + Int64(A0 * 2) + Int64(t * 16)
                fg = o_base + Int64(_imin(g, m_rows - 1)) * Int64(so) * 2
                fh = o_base + Int64(_imin(g + 8, m_rows - 1)) * Int64(so) * 2
                afr = []
                for s_ in cutlass.range_constexpr(SB):
                    xg = ld_l2_v4(fg + Int64(s_ * 64))
                    if cutlass.const_expr(MT == 16):
                        xh = ld_l2_v4(fh + Int64(s_ * 64))
                    else:
                        xh = [Int32(0)] * 4
                    afr.append([xg[0], xh[0], xg[1], xh[1], xg[2], xh[2], xg[3], xh[3]])
                for ps in cutlass.range_constexpr(FP):
                    wv = []
                    for r in cutlass.range_constexpr(RB):
                        row = _imin(row0 + (ps * RB + r) * 8 + g, NB - 1)
                        ra = wb_base + Int64(row) * (KB * 2) + Int64(t * 16)
                        for s_ in cutlass.range_constexpr(SB):
                            wv.append(ld_weights_v4(ra + Int64(s_ * 64)))
                    acc = [[Float32(0.0)] * 4 for _ in range(RB)]
                    for s_ in cutlass.range_constexpr(SB):
                        for r in cutlass.range_constexpr(RB):
                            acc[r] = mma_k32(afr[s_], wv[r * SB + s_], acc[r])
                    for r in cutlass.range_constexpr(RB):
                        for h in cutlass.range_constexpr(MT // 8):
                            m = g + 8 * h
                            for e in cutlass.range_constexpr(2):
                                col = row0 + (ps * RB + r) * 8 + 2 * t + e
                                if m < m_rows:
                                    if col < NB:
                                        mG[m, col] = acc[r][2 * h + e].to(BFloat16)

    @cute.jit
    def host(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, mWB: cute.Tensor,
             mG: cute.Tensor, mC: cute.Tensor, stream):
        kernel(mX, mW, mO, mWB, mG, mC).launch(grid=(GRID, 1, 1), block=(NTHR, 1, 1),
                                               stream=stream, use_pdl=PDL, **_launch_attrs(cfg))

    return host


def compile_tvm_ffi(cfg: Config, n: int, k: int, a0: int, nb: int, kb: int, extra_options: str = ""):
    host = build_fused_sk(cfg, n, k, a0, nb, kb)
    opts = "--enable-tvm-ffi" + (" " + extra_options if extra_options else "")
    return cute.compile(host, *fake_args_fused(n, k, nb, kb), options=opts)
