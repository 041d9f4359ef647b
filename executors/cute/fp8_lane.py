"""The per-lane program of the fp8 skinny GEMM, written once over an ``ops`` namespace.

fp8_kernels.py traces it with CuTe DSL values and inline PTX (the real kernel); the tests run it
on numpy vectors of the 32 lanes of a warp with an emulated mma (tests/fp8emu.py), so the
addressing, the K schedule, the fragment use and the scale promotion that the CPU checks see
are the ones the GPU runs. Plain Python loops and ifs here unroll at trace time.

``ops`` provides: Int32, Int64, Float32 (constructors), imin(a, b), ld_w(addr) / ld_x(addr)
(16-byte loads of weights / activations as 4 words), ld_f32 / ld_f32_nc (scalar fp32 loads of
activation / weight scales), cvt_hw(word) / cvt_bits(word) (4 e4m3 -> 2 f16x2 words, see
fp8.word_byte_order) and mma(a[4], b[2], c[4]) (m16n8k16 f16, fp32 accumulate); for the bulk
ring (bulk > 0) also mbar_init(bar, count, idx, limit), mbar_init_fence(), expect_tx(bar, nbytes,
idx, limit), bulk(dst, src, nbytes, bar, idx, limit) (the predicated ones act where idx < limit),
mbar_wait(bar, parity), ld_smem(addr) (16 bytes of shared memory as 4 words) and sync_warp();
for ``l2pre`` prefetch_l2(addr, nbytes, idx, limit) (a bulk L2 prefetch where idx < limit).

Lane layout (g = lane / 4, t = lane % 4): per n8 tile and 64-wide K step the lane loads 16 bytes
of weight row g and of x rows g, g + 8, at K offset step * 64 + t * 16. Word j of each vector
feeds the j-th k16 mma of the step (x words as a0/a2 and a1/a3, weight words as b0/b1), so both
operands see the same K permutation. Accumulator value e of tile r holds token g + 8 (e // 2),
output column n_tile0 + 8 r + 2 t + e % 2 (the mma C fragment).

With ``bulk`` = S > 0 the weights go through shared memory instead: each warp has a ring of S
stages, one per iteration, each with its mbarrier. Lane l < 8R copies the warp's weight row l
(n_tile0 + l) of the iteration's unroll K blocks, contiguous in global memory, with one bulk copy
(the TMA unit: bytes in flight that hold neither registers nor load slots); lane 0 arms the
barrier with the stage's byte count. All S stages are filled before the PDL wait (so a block
resident beside the previous kernel holds its first S iterations on chip when it is released).
Iteration it waits for its stage's phase, reads the same 16-byte vectors as the register path
from shared memory, and the stage is refilled with iteration it + S at the start of iteration
it + 1 (after the warp's mma of iteration it have consumed every lane's reads). S = 1 is a
serial ring: each later iteration's copy is issued after the one before is consumed.

With ``l2pre`` = P > 0, before the PDL wait each warp also prefetches into L2 (one bulk prefetch
per weight row, lanes < 8R) the K blocks of the block's iterations [first, P), first being the
iterations it loads then (depth, or S in the ring): ki 0, its own contiguous range; ki 1, the
block's range [first, P) is contiguous and split into one chunk per warp.

With ``xahead`` = A, the x vectors and activation scales of iteration it + A (in the ring also
its weight scales) are loaded during iteration it; A = 1 is the program without the option.
"""

from __future__ import annotations

from .fp8_config import BLOCK, Fp8Config

__all__ = ["LaneProgram", "k_block", "scale_a_index", "scale_b_index", "acc_entries"]


def k_block(it, u, wk, warps_k: int, unroll: int, nit: int, ki: int):
    """128-wide K block of unroll step u in iteration it of warp wk (ki: warps interleaved)."""
    if ki:
        return (it * warps_k + wk) * unroll + u
    return (wk * nit + it) * unroll + u


def scale_a_index(kind: int, row, kb, s0, s1):
    """Element offset of scale_a for token `row`, K block kb (kind 0 tensor, 1 row, 2 block)."""
    if kind == 0:
        return 0
    if kind == 1:
        return row * s0
    return row * s0 + kb * s1


def scale_b_index(kind: int, n_row, kb, s0, s1):
    """Element offset of scale_b for weight row n_row, K block kb (0 tensor, 1 col, 2 block)."""
    if kind == 0:
        return 0
    if kind == 1:
        return n_row * s0
    return (n_row // BLOCK) * s0 + kb * s1


def acc_entries(tiles: int, m_tile: int, g, t):
    """(tile r, value e, token row m, column within the tile) of every accumulator value of lane
    (g, t) (the m16n8 C fragment: c0, c1 = row g, columns 2t, 2t + 1; c2, c3 = row g + 8)."""
    return [(r, 2 * h + e, g + 8 * h, 2 * t + e)
            for r in range(tiles) for h in range(m_tile // 8) for e in range(2)]


class LaneProgram:
    def __init__(self, ops, cfg: Fp8Config, n: int, k: int, a: int, b: int):
        self.o = ops
        self.MT, self.R, self.WN, self.WK = cfg.m_tile, cfg.tiles, cfg.warps_n, cfg.warps_k
        self.U, self.KI, self.HW, self.D = cfg.unroll, cfg.ki, cfg.hw, cfg.depth
        self.S, self.XA, self.P = cfg.bulk, cfg.xahead, cfg.l2pre
        self.first = cfg.loaded_first(k)
        self.row_bytes, self.stage_bytes = cfg.bulk_row_bytes(), cfg.bulk_stage_bytes()
        self.NIT = cfg.iterations(k)
        self.N, self.K, self.A, self.B = n, k, a, b
        self.out_blk = self.WN * self.R * self.MT * 8  # outputs per block (incl. padded rows)

    # ---- addresses ------------------------------------------------------------------
    def setup_weights(self, w_base, n_tile0, g, t, wk, sb_base, sbs0, sbs1):
        """Weight-side addresses (before the PDL wait). Rows past N are clamped to N - 1 (their
        outputs are dropped); the warp's 8R rows share one 128-row scale block (R | 16)."""
        o = self.o
        self.wk = wk
        self.w_base, self.n_tile0 = w_base, n_tile0
        self.lane_w = g * 4 + t
        self.w_rows = [w_base + o.Int64(o.imin(n_tile0 + 8 * r + g, self.N - 1)) * self.K
                       + o.Int64(t * 16) for r in range(self.R)]
        self.sb_base, self.sbs0, self.sbs1 = sb_base, o.Int64(sbs0), o.Int64(sbs1)
        self.nb_row = o.Int64(o.imin(n_tile0, self.N - 1))
        self.sb_t = o.ld_f32_nc(sb_base) if self.B == 0 else o.Float32(1.0)

    def setup_acts(self, x_base, sx, m_rows, g, t, sa_base, sas0, sas1):
        """Activation-side addresses (after the PDL wait); token rows clamped to M - 1."""
        o = self.o
        self.rg = o.Int64(o.imin(g, m_rows - 1))
        self.rh = o.Int64(o.imin(g + 8, m_rows - 1))
        self.xg = x_base + self.rg * o.Int64(sx) + o.Int64(t * 16)
        self.xh = x_base + self.rh * o.Int64(sx) + o.Int64(t * 16)
        self.sa_base, self.sas0, self.sas1 = sa_base, o.Int64(sas0), o.Int64(sas1)
        self.sa_t = o.ld_f32(sa_base) if self.A == 0 else o.Float32(1.0)

    def kb(self, it, u):
        return k_block(it, u, self.wk, self.WK, self.U, self.NIT, self.KI)

    # ---- loads ----------------------------------------------------------------------
    def load_w(self, it):
        """Weight vectors of iteration it, index (u * 2 + h) * R + r (h: 64-wide half)."""
        out = []
        for u in range(self.U):
            kb = self.kb(it, u)
            for h in range(2):
                for r in range(self.R):
                    out.append(self.o.ld_w(self.w_rows[r] + self.o.Int64(kb * BLOCK + h * 64)))
        return out

    # ---- the bulk-copy ring (bulk > 0) ------------------------------------------------
    def setup_bulk(self, ring, bars, warp, lane, g, t):
        """Stage s of warp `warp` starts at ring + (warp * S + s) * stage_bytes, its weight row l
        (tile l // 8, row l % 8) row_bytes further per row; its mbarrier is at
        bars + (warp * S + s) * 8."""
        o = self.o
        self.lane = lane
        self.ring = ring + warp * o.Int32(self.S * self.stage_bytes)
        self.bars = bars + warp * o.Int32(self.S * 8)
        self.copy_src = self.w_base + o.Int64(o.imin(self.n_tile0 + lane, self.N - 1)) * self.K
        self.copy_dst = self.ring + lane * o.Int32(self.row_bytes)
        self.read_at = [self.ring + (g + o.Int32(8 * r)) * o.Int32(self.row_bytes) + t * o.Int32(16)
                        for r in range(self.R)]

    def bulk_init(self):
        o = self.o
        for s in range(self.S):
            o.mbar_init(self.bars + o.Int32(s * 8), 1, self.lane, 1)
        o.mbar_init_fence()
        o.sync_warp()

    def bulk_issue(self, it):
        """Lane 0 arms stage it % S for its bytes, then lanes 0..8R-1 copy their rows of
        iteration it's K blocks into it (nothing past the last iteration)."""
        if it >= self.NIT:
            return
        o = self.o
        s = it % self.S
        bar = self.bars + o.Int32(s * 8)
        nbytes = self.U * BLOCK
        o.sync_warp()  # every lane is past its reads of the stage's previous iteration
        o.expect_tx(bar, 8 * self.R * nbytes, self.lane, 1)
        src = self.copy_src + o.Int64(self.kb(it, 0) * BLOCK)
        o.bulk(self.copy_dst + o.Int32(s * self.stage_bytes), src, nbytes, bar, self.lane, 8 * self.R)

    def bulk_wait(self, it):
        self.o.mbar_wait(self.bars + self.o.Int32((it % self.S) * 8), (it // self.S) & 1)

    def bulk_read(self, it, u):
        """Unroll step u's weight vectors of iteration it from its stage, at load_w's indices
        (u * 2 + h) * R + r (the other steps' entries None)."""
        o = self.o
        out = [None] * (self.U * 2 * self.R)
        off = (it % self.S) * self.stage_bytes + u * BLOCK
        for h in range(2):
            for r in range(self.R):
                out[(u * 2 + h) * self.R + r] = o.ld_smem(self.read_at[r] + o.Int32(off + h * 64))
        return out

    def l2_range(self):
        """(first K block, K blocks) of this warp's L2 prefetch of every one of its rows."""
        n_it = self.P - self.first
        if self.KI:
            return (self.first * self.WK + self.wk * n_it) * self.U, n_it * self.U
        return (self.wk * self.NIT + self.first) * self.U, n_it * self.U

    def l2_prefetch(self):
        """Lane l < 8R prefetches weight row n_tile0 + l over l2_range() into L2."""
        o = self.o
        kb0, nkb = self.l2_range()
        row = o.Int64(o.imin(self.n_tile0 + self.lane_w, self.N - 1))
        o.prefetch_l2(self.w_base + row * self.K + o.Int64(kb0 * BLOCK), o.Int32(nkb * BLOCK),
                      self.lane_w, 8 * self.R)

    def load_sb(self, it):
        """Weight block scale of each unroll step (block kind only)."""
        if self.B != 2:
            return []
        o = self.o
        return [o.ld_f32_nc(self.sb_base + scale_b_index(2, self.nb_row, o.Int64(self.kb(it, u)),
                                                          self.sbs0, self.sbs1) * 4)
                for u in range(self.U)]

    def load_x(self, it):
        """x vectors (rows g, g + 8; zeros at m_tile 8) of iteration it, index u * 2 + h."""
        o = self.o
        out = []
        for u in range(self.U):
            kb = self.kb(it, u)
            for h in range(2):
                off = o.Int64(kb * BLOCK + h * 64)
                xg = o.ld_x(self.xg + off)
                xh = o.ld_x(self.xh + off) if self.MT == 16 else [o.Int32(0)] * 4
                out.append((xg, xh))
        return out

    def load_sa(self, it):
        """Activation block scales of rows g, g + 8 per unroll step (block kind only)."""
        if self.A != 2:
            return []
        o = self.o
        out = []
        for u in range(self.U):
            kb = o.Int64(self.kb(it, u))
            sg = o.ld_f32(self.sa_base + scale_a_index(2, self.rg, kb, self.sas0, self.sas1) * 4)
            sh = (o.ld_f32(self.sa_base + scale_a_index(2, self.rh, kb, self.sas0, self.sas1) * 4)
                  if self.MT == 16 else sg)
            out.append((sg, sh))
        return out

    # ---- math -----------------------------------------------------------------------
    def block_mma(self, w, x, u):
        """Partial sums of unroll step u (one K block) for the R tiles: (words converted by the
        hardware, words converted by integer ops), each R x 4 fp32, None where unused."""
        o = self.o
        zero = [o.Float32(0.0)] * 4
        ph = [zero for _ in range(self.R)] if self.HW > 0 else None
        pb = [zero for _ in range(self.R)] if self.HW < 4 else None
        for h in range(2):
            xg, xh = x[u * 2 + h]
            for j in range(4):
                cvt = o.cvt_hw if j < self.HW else o.cvt_bits
                xa = cvt(xg[j])
                xb = cvt(xh[j]) if self.MT == 16 else [o.Int32(0), o.Int32(0)]
                afrag = [xa[0], xb[0], xa[1], xb[1]]
                for r in range(self.R):
                    wc = cvt(w[(u * 2 + h) * self.R + r][j])
                    if j < self.HW:
                        ph[r] = o.mma(afrag, wc, ph[r])
                    else:
                        pb[r] = o.mma(afrag, wc, pb[r])
        return ph, pb

    def promote(self, acc, ph, pb, sa, sb, u):
        """acc += (ph + 2^16 pb) * sa * sb of this K block (block kinds; 1 otherwise). The
        integer-converted operands are 2^-8 of their values each, hence 2^16 on their products."""
        o = self.o
        for r in range(self.R):
            for e in range(4):
                if ph is None:
                    q = pb[r][e] * o.Float32(65536.0)
                elif pb is None:
                    q = ph[r][e]
                else:
                    q = ph[r][e] + pb[r][e] * o.Float32(65536.0)
                f = None
                if self.A == 2:
                    f = sa[u][0] if e < 2 else sa[u][1]
                if self.B == 2:
                    f = sb[u] if f is None else f * sb[u]
                acc[r][e] = acc[r][e] + (q if f is None else q * f)
        return acc

    def preload(self):
        """The weight vectors and scales of the first `depth` iterations (issued before the PDL
        wait: they do not depend on the previous kernel); with the bulk ring, the barriers'
        set-up, the copies of the first S iterations and iteration 0's weight scales; then the
        L2 prefetch of the iterations up to l2pre."""
        if self.S:
            self.bulk_init()
            for i in range(self.first):
                self.bulk_issue(i)
            pre = None, [self.load_sb(i) for i in range(min(self.XA, self.NIT))]
        else:
            d = min(self.D, self.NIT)
            pre = [self.load_w(i) for i in range(d)], [self.load_sb(i) for i in range(d)]
        if self.P:
            self.l2_prefetch()
        return pre

    def run(self, pre):
        """The K loop over preload()'s first iterations: iteration it + depth's weights and
        it + xahead's activations and activation scales are issued before iteration it's
        conversions and mma."""
        if self.S:
            return self._run_bulk(pre[1])
        ws, sbs = pre
        d = len(ws)
        A = self.XA
        xq, saq = self._acts_ahead()
        acc = [[self.o.Float32(0.0)] * 4 for _ in range(self.R)]
        for it in range(self.NIT):
            if it + d < self.NIT:
                ws.append(self.load_w(it + d))
                sbs.append(self.load_sb(it + d))
            if it + A < self.NIT:
                xq.append(self.load_x(it + A))
                saq.append(self.load_sa(it + A))
            for u in range(self.U):
                ph, pb = self.block_mma(ws[it], xq[it], u)
                acc = self.promote(acc, ph, pb, saq[it], sbs[it], u)
            ws[it] = sbs[it] = xq[it] = saq[it] = None  # consumed
        return acc

    def _acts_ahead(self):
        """The x vectors and activation scales of the first xahead iterations (after the PDL
        wait), as the two queues the K loops extend."""
        first = range(min(self.XA, self.NIT))
        return [self.load_x(i) for i in first], [self.load_sa(i) for i in first]

    def _run_bulk(self, sbq):
        """The ring's K loop: from iteration 1 on, the stage iteration it - 1 used is refilled
        with iteration it + S - 1; x and the scales of iteration it + xahead are loaded into
        registers."""
        o = self.o
        A = self.XA
        xq, saq = self._acts_ahead()
        acc = [[o.Float32(0.0)] * 4 for _ in range(self.R)]
        for it in range(self.NIT):
            if it:
                self.bulk_issue(it + self.S - 1)  # into the stage iteration it - 1 used
            if it + A < self.NIT:
                xq.append(self.load_x(it + A))
                saq.append(self.load_sa(it + A))
                sbq.append(self.load_sb(it + A))
            self.bulk_wait(it)
            for u in range(self.U):
                ph, pb = self.block_mma(self.bulk_read(it, u), xq[it], u)
                acc = self.promote(acc, ph, pb, saq[it], sbq[it], u)
            xq[it] = saq[it] = sbq[it] = None  # consumed
        return acc

    def final(self, s, m, col):
        """Output value of token m, column col from its fp32 sum: per-tensor / row / column
        factors (the block factors were applied per K block)."""
        o = self.o
        v = s * self.sa_t * self.sb_t
        if self.A == 1:
            v = v * o.ld_f32(self.sa_base + scale_a_index(1, o.Int64(m), 0, self.sas0, 0) * 4)
        if self.B == 1:
            v = v * o.ld_f32_nc(self.sb_base + scale_b_index(1, o.Int64(col), 0, self.sbs0, 0) * 4)
        return v

    # ---- epilogue geometry (warps_k > 1: shared-memory reduction) --------------------
    def red_slot(self, wk, wn, r, m, c8):
        """Shared-memory slot of warp (wn, wk)'s value for tile r, token m, tile column c8."""
        return ((wk * self.WN + wn) * self.R + r) * (self.MT * 8) + m * 8 + c8

    def out_coord(self, bid, idx):
        """(token m, column) of output idx (0 <= idx < out_blk) of block bid; the sum over the
        warps_k warps of output idx is at red_slot(q, ...) = q * out_blk + idx."""
        c8 = idx % 8
        m = (idx // 8) % self.MT
        rr = (idx // (8 * self.MT)) % self.R
        wnn = idx // (8 * self.MT * self.R)
        return m, (bid * self.WN + wnn) * (8 * self.R) + rr * 8 + c8
