"""CuTe DSL skinny-GEMM kernels (imports cutlass: load lazily, see __init__.py).

out[M, N] = x[M, K] @ w[N, K]^T with bf16 operands, fp32 accumulation, bf16 output.
Shapes: x (M, K) with row stride sx (stride(1) == 1, sx % 8 == 0, 16-byte aligned base),
w (N, K) contiguous, out (M, N) with row stride so (stride(1) == 1). M is a runtime
value (<= m_tile); N and K are compile-time constants. The fused whole-step kernel is in
fused.py, the inline-PTX operations in ptx.py.

PDL: weight vectors of the first K group are loaded before ``griddepcontrol.wait``;
everything that reads x (written by the previous kernel) comes after it. The wait is emitted
by pdl_wait so that ptxas keeps that order in the SASS (tests check it with nvdisasm).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64
from cutlass._mlir import ir

from .config import Config
from .ptx import (
    dot_bf16x2,
    ld_act_v4,
    ld_weights_v4,
    mma_k32,
    pdl_wait,
    prefetch_l2_bulk,
)

try:  # 4.8 spelling
    from cutlass.memory import SmemAllocator as _SmemAllocator
except Exception:  # pragma: no cover - 4.3 spelling
    from cutlass.utils import SmemAllocator as _SmemAllocator


def _launch_attrs(cfg: Config) -> dict:
    """Optional launch attributes of a tensor-core config (min_blocks_per_sm, smem_carveout)."""
    kw = {}
    if cfg.min_blocks_per_sm > 0:
        kw["min_blocks_per_mp"] = cfg.min_blocks_per_sm
        # an explicit carveout (-1 = the driver's default) keeps the DSL from asking the
        # device for its shared-memory size, so this compiles without a GPU
        kw["preferred_smem_carveout"] = -1
    if cfg.smem_carveout >= 0:
        kw["preferred_smem_carveout"] = cfg.smem_carveout
    return kw


def _imin(a, b):
    return cutlass.min(a, b)


def _prefetch_rows(w_base, n_tile0, lane, k0, R: int, N: int, K: int):
    """Byte address of (weight row n_tile0 + lane + 32 j, column k0) for the rows of this
    warp's 8R-row tile that lane handles in L2 prefetches (one list entry per j)."""
    out = []
    for j in range((8 * R + 31) // 32):  # plain Python loop: unrolled at trace time
        row = _imin(n_tile0 + lane + 32 * j, N - 1)
        out.append((w_base + Int64(row) * (K * 2) + Int64(k0 * 2), lane + 32 * j, 8 * R))
    return out


def _prefetch_chunks(pf_row, R: int, lane, it0: int, it1: int, U: int):
    """L2 bulk prefetch of K-iterations [it0, it1) (U 32-wide steps each) of every row
    of the warp's tile: lane l < 8R issues row l (and l + 32, ...)."""
    nbytes = (it1 - it0) * U * 64
    for addr, idx, limit in pf_row:
        prefetch_l2_bulk(addr + Int64(it0 * U * 64), Int32(nbytes), idx, limit)


# --------------------------------------------------------------------------------------
# Tensor-core kernel (kinds split_k and stream)
# --------------------------------------------------------------------------------------
def _weight_addrs(w_base, n_tile0, g, t, lane, step0, R: int, N: int, K: int, WL: int):
    """Byte address of this lane's weight vector for K step `step0` in each of its R n8 tiles.

    Row-major: row (tile row + g), columns step0*32 + t*8 .. +8. Tiled (tile_weights): the
    (tile, step) block is 512 contiguous bytes in lane order, so the lane's vector is at
    ((tile * K/32 + step) * 32 + lane) * 16. wl = 2 (swap): entries r = 2j, 2j + 1 are the two
    k16 A fragments of 16-row tile j. Rows/tiles past N are clamped (outputs dropped)."""
    out = []  # plain Python loop/if: this helper is traced, not AST-rewritten like a kernel body
    for r in range(R):
        if WL == 2:  # (16-row tile, step) blocks of 1 KB; n8 tile r is half r % 2 of 16-row tile r // 2
            tile = _imin(n_tile0 // 16 + r // 2, N // 16 - 1)
            out.append(w_base + (Int64(tile) * (K // 32) + Int64(step0)) * 1024 + Int64((r % 2) * 512 + lane * 16))
        elif WL == 1:
            tile = _imin(n_tile0 // 8 + r, N // 8 - 1)
            out.append(w_base + (Int64(tile) * (K // 32) + Int64(step0)) * 512 + Int64(lane * 16))
        else:
            row = _imin(n_tile0 + r * 8 + g, N - 1)
            out.append(w_base + Int64(row) * (K * 2) + Int64((step0 * 32 + t * 8) * 2))
    return out


def _load_w(w_addr, it: int, U: int, R: int, w_step: int, IS: int, u0: int = 0):
    """Weight vectors of K iteration `it` (IS steps after iteration it - 1): steps u0..U-1 x R n8
    tiles (see _weight_addrs)."""
    return [ld_weights_v4(w_addr[r] + Int64((it * IS + u) * w_step)) for u in range(u0, U) for r in range(R)]


def _x_addrs(x_base, sx, m_rows, g, koff):
    """Byte addresses of x rows g and g + 8 (clamped to M - 1) at byte offset koff."""
    return (x_base + Int64(_imin(g, m_rows - 1)) * Int64(sx) * 2 + koff,
            x_base + Int64(_imin(g + 8, m_rows - 1)) * Int64(sx) * 2 + koff)


def _load_x(xg_addr, xh_addr, it: int, U: int, MT: int, IS: int):
    """x vectors (rows g, g + 8; the second is zero for m_tile 8) of K iteration `it`."""
    regs = []
    for u in range(U):
        off = Int64((it * IS + u) * 64)
        xg = ld_act_v4(xg_addr + off)
        xh = ld_act_v4(xh_addr + off) if MT == 16 else [Int32(0)] * 4
        regs.append((xg, xh))
    return regs


def _k_steps(wk, WK: int, U: int, JW: int, KI: int):
    """(first 32-wide K step of warp wk, steps between its iterations). KI = 0: the warp
    owns the contiguous K slice [wk * JW, (wk + 1) * JW). KI = 1: iteration it of warp wk
    is steps (it * WK + wk) * U .. + U, so the WK warps of a block read one contiguous
    WK * U * 64-byte run of every weight row per iteration instead of WK runs spread over it."""
    if KI:
        return wk * U, WK * U
    return wk * JW, U


def _stream_mma(w_cur, w_addr, w_step: int, xg_addr, xh_addr, pf_row, lane,
                MT: int, R: int, U: int, NIT: int, PF: int, IS: int, hook=None, SWAP: int = 0):
    """The streaming main loop of the tensor-core kernels (build_tc, build_fused): w_cur
    (iteration 0's weights) is loaded by the caller before its PDL wait; iteration it + 1 is
    loaded while iteration it runs its mma.sync steps. hook = (it, addr, nbytes, idx): an L2
    bulk prefetch issued after the mma steps of iteration it where idx < 1 (Config.prefetch_fb_l2).
    Returns this lane's accumulators (see _acc_entries for their layout).
    SWAP: the weights (two 16-byte A fragments per 16-row tile and step) are the A operand and
    x row g (+ 8) the B operand: (R // 2) x (MT // 8) accumulators."""
    x_cur = _load_x(xg_addr, xh_addr, 0, U, MT, IS)
    acc = [[Float32(0.0)] * 4 for _ in range(R // 2 * (MT // 8) if SWAP else R)]
    for it in range(NIT):
        if PF > 0 and it + PF < NIT:
            _prefetch_chunks(pf_row, R, lane, it + PF, it + PF + 1, U)
        if it + 1 < NIT:
            w_nxt = _load_w(w_addr, it + 1, U, R, w_step, IS)
            x_nxt = _load_x(xg_addr, xh_addr, it + 1, U, MT, IS)
        for u in range(U):
            xg, xh = x_cur[u]
            if SWAP:
                for j in range(R // 2):
                    a = list(w_cur[u * R + 2 * j]) + list(w_cur[u * R + 2 * j + 1])
                    for grp, xv in enumerate((xg, xh)[:MT // 8]):
                        i = j * (MT // 8) + grp
                        acc[i] = mma_k32(a, xv, acc[i])
                continue
            a = [xg[0], xh[0], xg[1], xh[1], xg[2], xh[2], xg[3], xh[3]]
            for r in range(R):
                acc[r] = mma_k32(a, w_cur[u * R + r], acc[r])
        if hook is not None and it == hook[0]:  # (iteration, addr, nbytes, idx)
            # after this iteration's mma steps: at the top of an iteration or after its loads
            # ptxas took 86-174 registers instead of 76-78 (m_tile 8); at m_tile 16 any place but
            # after the last iteration takes 102-110 (the default caps it with minb 3)
            prefetch_l2_bulk(hook[1], hook[2], hook[3], 1)
        if it + 1 < NIT:
            w_cur = w_nxt
            x_cur = x_nxt
    return acc


def _pdl_wait_and_release(tid):
    """Wait for the previous grid (pdl_wait), then let the next kernel launch now: it prefetches
    its own weights and then blocks in its griddepcontrol.wait until this grid has finished."""
    pdl_wait(tid)
    cute.arch.griddepcontrol_launch_dependents()


def _thread_coords():
    """(tid, bid, lane, warp) of this thread (1-D blocks and grid)."""
    tid, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    return tid, bid, tid % 32, tid // 32


def _stage_acc(red, acc, ents, wk, WN: int, wn, R: int, MT: int):
    """This lane's accumulators (see _acc_entries) into the shared-memory partials of warp
    (wk, wn): one MT x 8 tile per n8 tile r, ahead of the warps_k reduction."""
    for ai, ci, r, m, c8 in ents:  # plain Python loop: unrolled at trace time
        red[((wk * WN + wn) * R + r) * (MT * 8) + m * 8 + c8] = acc[ai][ci]


def _sum_partials(red, idxs, parts: int, stride: int):
    """[sum over p < parts of red[p * stride + i] for i in idxs], summed in p order."""
    s = [Float32(0.0) for _ in idxs]
    for p in range(parts):
        for j, i in enumerate(idxs):
            s[j] = s[j] + red[p * stride + i]
    return s


def _acc_entries(R: int, MT: int, SWAP: int, g, t):
    """(accumulator, component, n8 tile r, token row m, column c within the tile) of every
    accumulator value of this lane, for both operand roles: x as A (acc[r][2h + e] = token
    g + 8h, column 2t + e) or, with SWAP, the weights as A (acc[j * MT/8 + grp][2h + e] = weight
    row g + 8h of 16-row tile j, i.e. n8 tile 2j + h column g, and token grp * 8 + 2t + e)."""
    out = []
    if SWAP:
        for j in range(R // 2):
            for grp in range(MT // 8):
                for h in range(2):
                    for e in range(2):
                        out.append((j * (MT // 8) + grp, 2 * h + e, 2 * j + h, grp * 8 + 2 * t + e, g))
    else:
        for r in range(R):
            for h in range(MT // 8):
                for e in range(2):
                    out.append((r, 2 * h + e, r, g + 8 * h, 2 * t + e))
    return out


def build_tc(cfg: Config, n: int, k: int):
    MT = cfg.m_tile
    R = cfg.tiles
    WN = cfg.warps_n
    WK = cfg.warps_k
    U = cfg.unroll
    STEPS = k // 32
    JW = STEPS // WK  # 32-wide K steps per warp
    NIT = JW // U
    NTHR = 32 * WN * WK
    ROWS_BLK = 8 * R * WN
    GRID = cfg.grid(n)
    OUT_BLK = WN * R * MT * 8  # outputs per block (incl. padded rows)
    PDL = cfg.pdl
    PF = cfg.l2_prefetch_distance
    KI = cfg.interleave_k
    WL = cfg.weight_layout
    W_STEP = (64, 512, 1024)[WL]  # bytes between a lane's consecutive 32-wide K steps
    SWAP = cfg.weights_as_a
    N = n
    K = k

    @cute.kernel
    def kernel(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor):
        tid, bid, lane, warp = _thread_coords()
        g = lane // 4
        t = lane % 4
        wn = warp % WN
        wk = warp // WN
        n_tile0 = (bid * WN + wn) * (8 * R)

        w_base = mW.iterator.toint()
        # byte address of this lane's first weight vector in each n8 tile
        ks0, IS = _k_steps(wk, WK, U, JW, KI)
        w_addr = _weight_addrs(w_base, n_tile0, g, t, lane, ks0, R, N, K, WL)

        pf_row = _prefetch_rows(w_base, n_tile0, lane, wk * JW * 32, R, N, K)
        if cutlass.const_expr(PF > 0):
            _prefetch_chunks(pf_row, R, lane, 0, min(PF, NIT), U)
        w_cur = _load_w(w_addr, 0, U, R, W_STEP, IS)
        if cutlass.const_expr(PDL):
            _pdl_wait_and_release(tid)

        m_rows = mX.shape[0]
        sx = mX.stride[0]
        x_base = mX.iterator.toint()
        koff = Int64((ks0 * 32 + t * 8) * 2)
        xg_addr, xh_addr = _x_addrs(x_base, sx, m_rows, g, koff)
        acc = _stream_mma(w_cur, w_addr, W_STEP, xg_addr, xh_addr, pf_row, lane, MT, R, U, NIT, PF, IS,
                          None, SWAP)

        ents = _acc_entries(R, MT, SWAP, g, t)
        if cutlass.const_expr(WK == 1):
            for q in cutlass.range_constexpr(len(ents)):
                ai, ci, r, m, c8 = ents[q]
                col = n_tile0 + r * 8 + c8
                if m < m_rows:
                    if col < N:
                        mO[m, col] = acc[ai][ci].to(BFloat16)
        else:
            smem = _SmemAllocator()
            red = smem.allocate_tensor(Float32, cute.make_layout(WK * OUT_BLK), byte_alignment=16)
            _stage_acc(red, acc, ents, wk, WN, wn, R, MT)
            cute.arch.sync_threads()
            for p in cutlass.range_constexpr((OUT_BLK + NTHR - 1) // NTHR):
                idx = tid + p * NTHR
                if idx < OUT_BLK:
                    s = _sum_partials(red, [idx], WK, OUT_BLK)[0]
                    col8 = idx % 8
                    m = (idx // 8) % MT
                    rr = (idx // (8 * MT)) % R
                    wnn = idx // (8 * MT * R)
                    col = (bid * WN + wnn) * (8 * R) + rr * 8 + col8
                    if m < m_rows:
                        if col < N:
                            mO[m, col] = s.to(BFloat16)

    @cute.jit
    def host(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, stream):
        kernel(mX, mW, mO).launch(grid=(GRID, 1, 1), block=(NTHR, 1, 1), stream=stream,
                                  use_pdl=PDL, **_launch_attrs(cfg))

    _ = ROWS_BLK
    return host


# --------------------------------------------------------------------------------------
# CUDA-core split-N kernel (small N, large K)
# --------------------------------------------------------------------------------------
def build_split_n(cfg: Config, n: int, k: int):
    MT = cfg.m_tile
    RB = cfg.rows
    V = cfg.vec
    NTHR = k // (8 * V)
    NWARP = NTHR // 32
    GRID = cfg.grid(n)
    NACC = MT * RB
    PDL = cfg.pdl
    N = n
    K = k

    @cute.kernel
    def kernel(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor):
        tid, bid, lane, warp = _thread_coords()
        row0 = bid * RB
        w_base = mW.iterator.toint()
        wv = []
        for r in cutlass.range_constexpr(RB):
            row = _imin(row0 + r, N - 1)
            rv = []
            for v in cutlass.range_constexpr(V):
                rv.append(ld_weights_v4(w_base + Int64(row) * (K * 2)
                                        + Int64((tid + v * NTHR) * 16)))
            wv.append(rv)
        if cutlass.const_expr(PDL):
            _pdl_wait_and_release(tid)

        m_rows = mX.shape[0]
        sx = mX.stride[0]
        x_base = mX.iterator.toint()
        acc = [Float32(0.0)] * NACC
        for m in cutlass.range_constexpr(MT):
            xr = _imin(Int32(m), m_rows - 1)
            xa = x_base + Int64(xr) * Int64(sx) * 2
            for v in cutlass.range_constexpr(V):
                xv = ld_act_v4(xa + Int64((tid + v * NTHR) * 16))
                for r in cutlass.range_constexpr(RB):
                    a = acc[m * RB + r]
                    for q in cutlass.range_constexpr(4):
                        a = dot_bf16x2(wv[r][v][q], xv[q], a)
                    acc[m * RB + r] = a

        smem = _SmemAllocator()
        red = smem.allocate_tensor(Float32, cute.make_layout(NWARP * NACC), byte_alignment=16)
        for i in cutlass.range_constexpr(NACC):
            s = cute.arch.warp_reduction_sum(acc[i])
            if lane == 0:
                red[warp * NACC + i] = s
        cute.arch.sync_threads()
        for p in cutlass.range_constexpr((NACC + NTHR - 1) // NTHR):
            idx = tid + p * NTHR
            if idx < NACC:
                s = _sum_partials(red, [idx], NWARP, NACC)[0]
                m = idx // RB
                col = row0 + idx % RB
                if m < m_rows:
                    if col < N:
                        mO[m, col] = s.to(BFloat16)

    @cute.jit
    def host(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, stream):
        kernel(mX, mW, mO).launch(grid=(GRID, 1, 1), block=(NTHR, 1, 1), stream=stream,
                                  use_pdl=PDL)

    return host


def build_host(cfg: Config, n: int, k: int):
    if cfg.kind == "split_n":
        return build_split_n(cfg, n, k)
    return build_tc(cfg, n, k)


def fake_args(n: int, k: int):
    """Fake tensors/stream for TVM-FFI compilation: M and the row strides are runtime."""
    m = cute.sym_int()
    sx = cute.sym_int64(divisibility=8)
    so = cute.sym_int64()
    x = cute.runtime.make_fake_tensor(BFloat16, (m, k), stride=(sx, 1), assumed_align=16)
    w = cute.runtime.make_fake_tensor(BFloat16, (n, k), stride=(k, 1), assumed_align=16)
    o = cute.runtime.make_fake_tensor(BFloat16, (m, n), stride=(so, 1), assumed_align=2)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return x, w, o, stream


def compile_tvm_ffi(cfg: Config, n: int, k: int, extra_options: str = ""):
    host = build_host(cfg, n, k)
    x, w, o, stream = fake_args(n, k)
    opts = "--enable-tvm-ffi" + (" " + extra_options if extra_options else "")
    return cute.compile(host, x, w, o, stream, options=opts)


_ = ir
