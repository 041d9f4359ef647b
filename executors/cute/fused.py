"""The fused KDA step kernel (imports cutlass: load lazily, see __init__.py): one grid streams
the packed weight (out = x @ w^T, kernels.py's tensor-core main loop) and computes the dependent
F_B GEMM (g1 = out[:, a0:a0+kb] @ w_fb^T) in consumer blocks that take f_a from producer blocks."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from .config import Config
from .kernels import (
    _acc_entries,
    _imin,
    _k_steps,
    _launch_attrs,
    _load_w,
    _pdl_wait_and_release,
    _prefetch_chunks,
    _prefetch_rows,
    _SmemAllocator,
    _stage_acc,
    _stream_mma,
    _sum_partials,
    _thread_coords,
    _weight_addrs,
    _x_addrs,
)
from .ptx import (
    _stamp,
    fence_acq_rel_gpu,
    ld_epoch,
    ld_l2_v4,
    ld_weights_v4,
    mma_k32,
    pack_bf16x2,
    poll_tagged,
    prefetch_l2_bulk,
    red_add_release_gpu,
    red_epoch,
    st_global_words,
    st_tagged,
    wait_then_arrive,
)


# --------------------------------------------------------------------------------------
# Fused whole-step kernel: streaming GEMM over the packed weight + the dependent F_B GEMM
# --------------------------------------------------------------------------------------
def build_fused(cfg: Config, n: int, k: int, a0: int, nb: int, kb: int):
    """out[M, n] = x @ w[n, k]^T and g1[M, nb] = out[:, a0:a0+kb] @ w_fb[nb, kb]^T, one grid.

    Blocks 0..P-1 (scheduled first) stream the weight tiles that hold out[:, a0:a0+kb]
    (f_a), then publish them: the block syncs, thread 0 fences and does a release add
    on a global counter. Blocks P..T-1 stream the other tiles. The last C
    blocks (highest blockIdx, so normally scheduled last) prefetch their F_B weights,
    spin (acquire) until the counter reaches P, compute F_B from f_a read through L2,
    and count themselves in; the last arrival resets the counter to 0, so no memset is
    needed between launches or graph replays. No ordering assumption is needed to be
    deadlock-free: producers never wait, and C is far below the resident capacity.
    ``tagged_handoff`` (the default when f_a is tile-aligned): the producers also store f_a as
    64-bit (bf16x2, epoch + 1) pairs in the workspace and one warp per 8 rows of every
    consumer spins on those pairs themselves, so no fence, no counter round trip and no reload of f_a sit
    between the last producer and F_B. The epoch is the 64-bit arrival word at workspace
    byte 8 over EPOCH_SPAN, read after the PDL wait; each of the P + C blocks adds its share of
    EPOCH_SPAN with a fire-and-forget red at its end (no atomic round trip keeps the last
    blocks alive), so the next launch tags with the next value and stale pairs never match.
    ``prefetch_producer_weights``: the producers bulk-prefetch all their weight rows into L2 at
    launch. ``timeline`` (the debug switch, see Config.timeline) stamps %globaltimer per block
    into the workspace (scripts/fused_timeline.py reads them).
    """
    from .config import fused_grid, fused_tag_offset

    MT = cfg.m_tile
    R = cfg.tiles
    WK = cfg.warps_k
    WN = cfg.warps_n
    NW = WN * WK  # warps per block
    U = cfg.unroll
    RB = cfg.fb_tiles
    STEPS = k // 32
    JW = STEPS // WK
    NIT = JW // U
    NTHR = 32 * NW
    OUT_BLK = WN * R * MT * 8  # outputs per block (incl. padded rows)
    T_ALL, T0, P, C = fused_grid(cfg, n, a0, kb, nb)
    GRID = T_ALL + C
    TOTAL = P + C
    TAG_OFF = fused_tag_offset(cfg, n, a0, kb, nb)  # tagged f_a pairs (TAG), bytes
    NV1 = 4 * (kb // 32)  # f_a words per consumer lane and row
    SB = kb // 32
    FP = cfg.fb_passes
    PDL = cfg.pdl
    PF = cfg.l2_prefetch_distance
    KI = cfg.interleave_k
    WL = cfg.weight_layout
    W_STEP = (64, 512, 1024)[WL]
    SWAP = cfg.weights_as_a
    PPF = cfg.prefetch_producer_weights
    TAG = cfg.tagged_handoff
    TIMELINE = cfg.timeline
    FBPF = cfg.prefetch_fb_l2
    PWU = cfg.prologue_k_steps or U  # K steps of iteration 0 loaded before the PDL wait
    GST = cfg.g1_stores
    GROW = NW * RB * 4  # g1_stores 2: bf16x2 words per g1 row of a consumer block
    OVERHANG = TAG and (a0 % (8 * R * WN) or kb % (8 * R * WN))
    RP = -(-nb // max(1, P))  # W_FB rows per producer (prefetch_fb_l2)
    N = n
    K = k
    NB = nb
    KB = kb
    A0 = a0

    @cute.kernel
    def kernel(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, mWB: cute.Tensor,
               mG: cute.Tensor, mC: cute.Tensor):
        tid, bid, lane, warp = _thread_coords()
        g = lane // 4
        t = lane % 4
        m_rows = mX.shape[0]
        smem = _SmemAllocator()
        red = smem.allocate_tensor(Float32, cute.make_layout(WK * OUT_BLK), byte_alignment=16)
        if cutlass.const_expr(TAG):  # consumers: the polling warps stage f_a words here
            fs = smem.allocate_tensor(Int32, cute.make_layout(32 * NV1 * (MT // 8)), byte_alignment=16)
        if cutlass.const_expr(GST == 2):  # consumers: the block's g1 tile as bf16x2 words
            gsm = smem.allocate_tensor(Int32, cute.make_layout(MT * GROW), byte_alignment=16)
        ctr = mC.iterator.toint()
        so = mO.stride[0]
        sg = mG.stride[0]
        if cutlass.const_expr(TIMELINE):
            if tid == 0:
                _stamp(ctr, bid, 0)
        sb = bid  # position in the order [producers | other stream tiles | consumers]
        if sb < T_ALL:
            # ---------------- streaming part (producers first) ----------------
            tile = sb
            if sb < P:
                tile = sb + T0
            else:
                if sb - P < T0:
                    tile = sb - P
            wn = warp % WN  # warps side by side along N share their x slices (via L1)
            wk = warp // WN
            blk0 = tile * (8 * R * WN)
            n_tile0 = blk0 + wn * (8 * R)
            w_base = mW.iterator.toint()
            ks0, IS = _k_steps(wk, WK, U, JW, KI)
            w_addr = _weight_addrs(w_base, n_tile0, g, t, lane, ks0, R, N, K, WL)

            pf_row = _prefetch_rows(w_base, n_tile0, lane, wk * JW * 32, R, N, K)
            if cutlass.const_expr(PF > 0):
                _prefetch_chunks(pf_row, R, lane, 0, min(PF, NIT), U)
            if cutlass.const_expr(PPF > 0):
                if sb < P:
                    if cutlass.const_expr(WL == 2):
                        # the warp column's 16-row tiles are one contiguous region: a quarter of
                        # warp wk's WK-th part per lane 0..3
                        part = (R // 2) * (K // 32) * 1024 // WK
                        reg = w_base + Int64(n_tile0 // 16) * ((K // 32) * 1024)
                        prefetch_l2_bulk(reg + Int64(wk * part) + Int64(lane * (part // 4)),
                                         Int32(part // 4), lane, 4)
                    else:
                        _prefetch_chunks(pf_row, R, lane, 0, NIT, U)
            w_cur = _load_w(w_addr, 0, PWU, R, W_STEP, IS)
            if cutlass.const_expr(PDL):
                _pdl_wait_and_release(tid)
            if cutlass.const_expr(PWU < U):  # the rest of iteration 0 after the wait
                w_cur = w_cur + _load_w(w_addr, 0, U, R, W_STEP, IS, PWU)
            ep = Int32(0)
            if cutlass.const_expr(TAG):
                if sb < P:  # this launch's epoch (earlier launches advanced it)
                    ep = ld_epoch(ctr + Int64(8))

            sx = mX.stride[0]
            x_base = mX.iterator.toint()
            koff = Int64((ks0 * 32 + t * 8) * 2)
            xg_addr, xh_addr = _x_addrs(x_base, sx, m_rows, g, koff)
            hook = None
            if cutlass.const_expr(FBPF > 0):
                # producer sb prefetches W_FB rows [sb * RP, sb * RP + RP), one 256-byte row per
                # thread, after stream iteration NIT - FBPF (1: after the loop; > NIT: before it):
                # the consumer blocks start as the producers retire and need W_FB at once
                fb_idx = Int32(1 << 20)
                if sb < P:
                    if tid < RP:
                        if sb * RP + tid < NB:
                            fb_idx = Int32(0)
                fb_row = _imin(sb * RP + tid, NB - 1)
                hook = (NIT - FBPF, mWB.iterator.toint() + Int64(fb_row) * (KB * 2),
                        Int32(KB * 2), fb_idx)
                if cutlass.const_expr(FBPF > NIT):  # before the loop (it = -1)
                    prefetch_l2_bulk(hook[1], hook[2], hook[3], 1)
            acc = _stream_mma(w_cur, w_addr, W_STEP, xg_addr, xh_addr, pf_row, lane, MT, R, U, NIT, PF, IS,
                              hook, SWAP)

            ents = _acc_entries(R, MT, SWAP, g, t)
            _stage_acc(red, acc, ents, wk, WN, wn, R, MT)
            cute.arch.sync_threads()
            for p in cutlass.range_constexpr((OUT_BLK + NTHR - 1) // NTHR):
                idx = tid + p * NTHR
                if idx < OUT_BLK:
                    s = _sum_partials(red, [idx], WK, OUT_BLK)[0]
                    col8 = idx % 8
                    m = (idx // 8) % MT
                    rr = idx // (8 * MT)  # n8 tile within the block (wn * R + r)
                    col = blk0 + rr * 8 + col8
                    if m < m_rows:
                        if col < N:
                            mO[m, col] = s.to(BFloat16)
            if sb < P:
                if cutlass.const_expr(TIMELINE):
                    if tid == 0:
                        _stamp(ctr, bid, 1)
                if cutlass.const_expr(TAG):
                    # f_a again as (bf16x2, epoch + 1) pairs: the consumers spin on these
                    for pp in cutlass.range_constexpr((OUT_BLK // 2 + NTHR - 1) // NTHR):
                        pidx = tid + pp * NTHR
                        if pidx < OUT_BLK // 2:
                            i0 = 2 * pidx
                            s0, s1 = _sum_partials(red, [i0, i0 + 1], WK, OUT_BLK)
                            m = (i0 // 8) % MT
                            col = blk0 + (i0 // (8 * MT)) * 8 + i0 % 8
                            if cutlass.const_expr(OVERHANG):
                                # tiles wider than f_a's alignment (e.g. warps_n 3: 48 rows)
                                # also hold columns outside [A0, A0 + KB): not f_a, no pair
                                if col < A0 or col >= A0 + KB:
                                    m = MT
                            if m < m_rows:
                                pa = ctr + Int64(TAG_OFF) + Int64(m * (KB // 2) + (col - A0) // 2) * 8
                                st_tagged(pa, pack_bf16x2(s0, s1), ep + 1)
                    cute.arch.sync_threads()  # every thread's epoch read before the arrival
                    if tid == 0:
                        red_epoch(ctr + Int64(8), sb, TOTAL)
                else:
                    cute.arch.sync_threads()
                    if tid == 0:
                        # the barrier orders the block's f_a stores before this thread's fence
                        # (cumulative), so one fence per block publishes them all
                        fence_acq_rel_gpu()
                        red_add_release_gpu(ctr, Int32(1))
            if cutlass.const_expr(TIMELINE):
                if tid == 0:
                    _stamp(ctr, bid, 2)
        else:
            # ---------------- consumer part: g1 = f_a @ w_fb^T ----------------
            # a warp owns FP passes of RB n8 tiles; pass 0's weights are loaded up front,
            # later passes' rows are bulk-prefetched into L2 up front and loaded after the
            # previous pass (FP > 1 keeps the consumer blocks few, so the grid fits one wave)
            cb = sb - T_ALL
            row0 = (cb * NW + warp) * (8 * RB * FP)
            wb_base = mWB.iterator.toint()

            def load_wb(ps):
                regs = []
                for r in cutlass.range_constexpr(RB):
                    row = _imin(row0 + (ps * RB + r) * 8 + g, NB - 1)
                    ra = wb_base + Int64(row) * (KB * 2) + Int64(t * 16)
                    for sk in cutlass.range_constexpr(SB):
                        regs.append(ld_weights_v4(ra + Int64(sk * 64)))
                return regs

            wv = load_wb(0)
            if cutlass.const_expr(FP > 1):
                r1 = _imin(row0 + 8 * RB, NB - 1)
                nrows = _imin(row0 + 8 * RB * FP, NB) - r1
                if nrows > 0:
                    prefetch_l2_bulk(wb_base + Int64(r1) * (KB * 2), Int32(nrows * (KB * 2)), lane, 1)
            if cutlass.const_expr(PDL):
                _pdl_wait_and_release(tid)
            ep = Int32(0)
            if cutlass.const_expr(TAG):
                # warp h (< m_tile / 8) spins on the tagged f_a pairs of row g + 8h for its
                # lanes (8 columns per 32-wide K step) and stages the values for all warps.
                # One row per warp: a poll per (row, K step) takes fewer registers, lets 4
                # blocks/SM fit and made the step 4-5 us slower
                if warp < MT // 8:
                    ep = ld_epoch(ctr + Int64(8))
                    tb = ctr + Int64(TAG_OFF) + Int64(t * 32)
                    row = _imin(g + 8 * warp, m_rows - 1)
                    vals = poll_tagged(tb + Int64(row) * (KB * 4), ep + 1, SB)
                    for j in cutlass.range_constexpr(NV1):
                        fs[(warp * 32 + lane) * NV1 + j] = vals[j]
            else:
                if tid == 0:
                    wait_then_arrive(ctr, Int32(P), Int32(TOTAL))
            cute.arch.sync_threads()
            if cutlass.const_expr(TIMELINE):  # mid: f_a received
                if tid == 0:
                    _stamp(ctr, bid, 1)
            o_base = mO.iterator.toint() + Int64(A0 * 2) + Int64(t * 16)
            fg = o_base + Int64(_imin(g, m_rows - 1)) * Int64(so) * 2
            fh = o_base + Int64(_imin(g + 8, m_rows - 1)) * Int64(so) * 2
            afr = []
            for sk in cutlass.range_constexpr(SB):
                if cutlass.const_expr(TAG):
                    xg = [fs[lane * NV1 + sk * 4 + j] for j in range(4)]
                    if cutlass.const_expr(MT == 16):
                        xh = [fs[(32 + lane) * NV1 + sk * 4 + j] for j in range(4)]
                    else:
                        xh = [Int32(0)] * 4
                else:
                    xg = ld_l2_v4(fg + Int64(sk * 64))
                    if cutlass.const_expr(MT == 16):
                        xh = ld_l2_v4(fh + Int64(sk * 64))
                    else:
                        xh = [Int32(0)] * 4
                afr.append([xg[0], xh[0], xg[1], xh[1], xg[2], xh[2], xg[3], xh[3]])
            for ps in cutlass.range_constexpr(FP):
                if cutlass.const_expr(ps > 0):
                    wv = load_wb(ps)
                acc = [[Float32(0.0)] * 4 for _ in range(RB)]
                for sk in cutlass.range_constexpr(SB):
                    for r in cutlass.range_constexpr(RB):
                        acc[r] = mma_k32(afr[sk], wv[r * SB + sk], acc[r])
                for r in cutlass.range_constexpr(RB):
                    for h in cutlass.range_constexpr(MT // 8):
                        m = g + 8 * h
                        if cutlass.const_expr(GST == 2):  # staged: 16-byte stores below
                            gsm[m * GROW + (warp * RB + r) * 4 + t] = pack_bf16x2(acc[r][2 * h], acc[r][2 * h + 1])
                        elif cutlass.const_expr(GST == 1):
                            # columns 2t, 2t + 1 as one 32-bit store (NB even: both or none)
                            col = row0 + (ps * RB + r) * 8 + 2 * t
                            if m < m_rows:
                                if col < NB:
                                    ga = mG.iterator.toint() + (Int64(m) * Int64(sg) + Int64(col)) * 2
                                    st_global_words(ga, [pack_bf16x2(acc[r][2 * h], acc[r][2 * h + 1])])
                        else:
                            for e in cutlass.range_constexpr(2):
                                col = row0 + (ps * RB + r) * 8 + 2 * t + e
                                if m < m_rows:
                                    if col < NB:
                                        mG[m, col] = acc[r][2 * h + e].to(BFloat16)
            if cutlass.const_expr(GST == 2):
                # the block's g1 tile (MT rows x NW * RB * 8 contiguous columns, one pass) leaves
                # as 16-byte row chunks: one store per thread instead of 8 (4 with GST 1)
                cute.arch.sync_threads()
                for p in cutlass.range_constexpr((MT * GROW // 4 + NTHR - 1) // NTHR):
                    ch = tid + p * NTHR
                    if ch < MT * GROW // 4:
                        gm = ch // (GROW // 4)
                        gcol = cb * (NW * RB * 8) + (ch % (GROW // 4)) * 8
                        if gm < m_rows:
                            if gcol < NB:
                                gaddr = mG.iterator.toint() + (Int64(gm) * Int64(sg) + Int64(gcol)) * 2
                                st_global_words(gaddr, [gsm[ch * 4 + j] for j in range(4)])
            if cutlass.const_expr(TAG):
                if tid == 0:  # the epoch matters to the next launch only
                    red_epoch(ctr + Int64(8), Int32(P) + cb, TOTAL)
            if cutlass.const_expr(TIMELINE):
                if tid == 0:
                    _stamp(ctr, bid, 2)

    @cute.jit
    def host(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, mWB: cute.Tensor,
             mG: cute.Tensor, mC: cute.Tensor, stream):
        kernel(mX, mW, mO, mWB, mG, mC).launch(grid=(GRID, 1, 1), block=(NTHR, 1, 1),
                                               stream=stream, use_pdl=PDL, **_launch_attrs(cfg))

    return host


def fake_args_fused(n: int, k: int, nb: int, kb: int):
    m = cute.sym_int()
    sx = cute.sym_int64(divisibility=8)
    so = cute.sym_int64(divisibility=8)
    sg = cute.sym_int64()
    x = cute.runtime.make_fake_tensor(BFloat16, (m, k), stride=(sx, 1), assumed_align=16)
    w = cute.runtime.make_fake_tensor(BFloat16, (n, k), stride=(k, 1), assumed_align=16)
    o = cute.runtime.make_fake_tensor(BFloat16, (m, n), stride=(so, 1), assumed_align=16)
    wb = cute.runtime.make_fake_tensor(BFloat16, (nb, kb), stride=(kb, 1), assumed_align=16)
    g1 = cute.runtime.make_fake_tensor(BFloat16, (m, nb), stride=(sg, 1), assumed_align=2)
    c = cute.runtime.make_fake_tensor(Int32, (1,), stride=(1,), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return x, w, o, wb, g1, c, stream


def compile_fused_tvm_ffi(cfg: Config, n: int, k: int, a0: int, nb: int, kb: int,
                          extra_options: str = ""):
    host = build_fused(cfg, n, k, a0, nb, kb)
    args = fake_args_fused(n, k, nb, kb)
    opts = "--enable-tvm-ffi" + (" " + extra_options if extra_options else "")
    return cute.compile(host, *args, options=opts)
