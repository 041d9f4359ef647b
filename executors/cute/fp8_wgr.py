"""The register-weights warpgroup program of the fp8 skinny GEMM (Fp8Config.wgr), written once
over an ``ops`` namespace like fp8_lane.LaneProgram: fp8_kernels.py traces it with CuTe DSL
values and inline PTX, tests/fp8emu_wgr.py runs it on numpy vectors of a warpgroup's 128 threads
with wgmma emulated from its register fragment and shared-memory matrix descriptor.

D[64, MT] = W[64, K] . X[MT, K]^T per warpgroup: 64 weight rows are wgmma's M (A, from
registers), the m_tile tokens its N (B, x, from shared memory). A block is ``warps_k``
warpgroups on one 64-row tile, each over ``unroll`` consecutive 128-wide K blocks, reduced
through shared memory at the end; with ``ks`` > 1 a thread-block cluster of ks blocks shares the
tile, block (rank) r over the r-th ks-th of K, and after the block sums every block reduces a
ks-th of the tile's outputs from all the cluster's sums (distributed shared memory).

The weights go from global memory into the A fragments without shared memory: per K block, lane (g, t) of warp
w loads 16 bytes at K offsets 16t and 64 + 16t of rows 16w + g and 16w + g + 8 (a quad's four
threads read 64 contiguous bytes per load). Word i (0..7) of a row's two vectors sits at K offset
64 (i // 4) + 16t + 4 (i % 4) and serves k32 step s = i % 4 as register a0 / a1 (i < 4) or
a2 / a3 (i >= 4), so the wgmma sees the block's K order permuted by

    pi(32s + 16h + 4t + b) = 64h + 16t + 4s + b        (s, t, b in 0..3, h in 0..1)

and x is staged into shared memory in that same order: real 16-byte chunk c of a K block (words
4c..4c+3, h = c // 4, t = c % 4) goes, word s to logical K 32s + 16h + 4t, i.e. into core matrix
column 2s + h at byte 4t. x is B in the K-major canonical layout without swizzle: byte (token n,
logical K k) of the warpgroup's region at (n // 8) * SBO + (k // 16) * 128 + (n % 8) * 16 + k % 16,
SBO = unroll * 1024. Each warpgroup stages its own K range (every thread a share of the 16-byte
chunks: one global load, four 4-byte shared stores), fences the writes to the async proxy and
meets its named barrier.

Before the PDL wait each thread issues the weight loads of its first ``depth`` K blocks and their
block scales (nothing there depends on the previous kernel). After it: the staging, then per K
block 4 wgmma m64nMTk32 into a fresh partial, committed; the previous block's partial is promoted
with its scales once its group is waited for, and only then is the next block's weight loaded into
the registers it freed (depth blocks in flight). The activation scales are loaded two blocks ahead.
"""

from __future__ import annotations

from .fp8_config import BLOCK, Fp8Config
from .fp8_lane import LaneProgram, scale_a_index, scale_b_index
from .fp8_wg import desc_bits

ROWS = 64  # weight rows of a warpgroup: the wgmma M
SA_AHEAD = 2  # K blocks ahead that the activation scales are loaded


def staged_offset(n, kk, sbo: int):
    """Shared-memory byte of (token n, real K offset kk inside the warpgroup's range) in the
    staged x (kk word-aligned: the byte of that 4-byte word)."""
    j, r = kk // BLOCK, kk % BLOCK
    h, t, s = r // 64, (r // 16) % 4, (r // 4) % 4
    return (n // 8) * sbo + (j * 8 + 2 * s + h) * 128 + (n % 8) * 16 + 4 * t + r % 4


class WgrProgram(LaneProgram):
    def __init__(self, ops, cfg: Fp8Config, n: int, k: int, a: int, b: int):
        super().__init__(ops, cfg, n, k, a, b)
        self.KPW = cfg.unroll  # K blocks of a warpgroup
        self.D = min(cfg.depth, self.KPW)
        self.sbo = self.KPW * 8 * 128
        self.x_bytes = cfg.wgr_x_bytes()
        self.out_blk = ROWS * self.MT
        self.KS = cfg.ks
        self.share = self.out_blk // self.KS  # outputs each block of a cluster finishes
        self.chunks = self.MT * self.KPW * 8  # 16-byte chunks of x staged per warpgroup

    # ---- set-up ---------------------------------------------------------------------
    def setup_weights(self, w_base, n_tile0, g, t, wk, sb_base, sbs0, sbs1, rank=0):
        """g: the thread's row in the tile, 16 * warp + lane // 4 (rows g and g + 8); rank: the
        block's in its cluster."""
        o = self.o
        self.wk, self.w_base, self.n_tile0 = wk, w_base, n_tile0
        self.kb0 = (rank * self.WK + wk) * self.KPW
        self.w_rows = [w_base + o.Int64(o.imin(n_tile0 + g + 8 * h, self.N - 1)) * self.K
                       + o.Int64(t * 16) for h in range(2)]
        self.sb_base, self.sbs0, self.sbs1 = sb_base, o.Int64(sbs0), o.Int64(sbs1)
        self.nb_row = o.Int64(o.imin(n_tile0, self.N - 1))
        self.sb_t = o.ld_f32_nc(sb_base) if self.B == 0 else o.Float32(1.0)

    def setup_wg(self, region, wtid, bar_id):
        """The block's x regions' shared address, this thread's index in its warpgroup and the
        warpgroup's named barrier."""
        o = self.o
        self.wtid, self.bar_id = wtid, bar_id
        self.region = region + self.wk * o.Int32(self.x_bytes)
        self.desc0 = o.make_desc(self.region, desc_bits(128, self.sbo))

    def setup_acts(self, x_base, sx, m_rows, g, t, sa_base, sas0, sas1):
        """After the PDL wait: stage this warpgroup's x, and the activation-scale addresses of the
        thread's D columns (tokens 8i + 2t + e, clamped to M - 1)."""
        o = self.o
        self.sa_base, self.sas0, self.sas1 = sa_base, o.Int64(sas0), o.Int64(sas1)
        self.sa_t = o.ld_f32(sa_base) if self.A == 0 else o.Float32(1.0)
        self.tok = [o.Int64(o.imin(8 * i + 2 * t + e, m_rows - 1))
                    for i in range(self.MT // 8) for e in range(2)]
        per_row = self.KPW * 8
        for i in range(-(-self.chunks // 128)):
            q = o.imin(self.wtid + i * 128, self.chunks - 1)  # the last chunk again past the end
            n, cc = q // per_row, q % per_row
            src = (x_base + o.Int64(o.imin(n, m_rows - 1)) * o.Int64(sx)
                   + o.Int64((self.kb0 + cc // 8) * BLOCK) + o.Int64((cc % 8) * 16))
            words = o.ld_x(src)
            dst = self.region + o.Int32(staged_offset(n, cc * 16, self.sbo))
            for s in range(4):  # word s to core matrix column 2s + h
                o.st_smem32(dst + o.Int32(256 * s), words[s])

    # ---- loads ----------------------------------------------------------------------
    def load_w(self, j):
        """Weight vectors of local K block j: row g at 16t, at 64 + 16t, row g + 8 alike."""
        o = self.o
        kb = self.kb0 + j
        return [o.ld_w(self.w_rows[h] + o.Int64(kb * BLOCK + 64 * q)) for h in range(2) for q in range(2)]

    def load_sb(self, j):
        if self.B != 2:
            return None
        o = self.o
        return o.ld_f32_nc(self.sb_base + scale_b_index(2, self.nb_row, o.Int64(self.kb0 + j),
                                                         self.sbs0, self.sbs1) * 4)

    def load_sa(self, j):
        if self.A != 2:
            return []
        o = self.o
        kb = o.Int64(self.kb0 + j)
        return [o.ld_f32(self.sa_base + scale_a_index(2, r, kb, self.sas0, self.sas1) * 4) for r in self.tok]

    @staticmethod
    def frag(wv, s):
        """A fragment of k32 step s: a0 / a1 rows g / g + 8 word s, a2 / a3 their word 4 + s."""
        return [wv[0][s], wv[2][s], wv[1][s], wv[3][s]]

    def desc(self, j, s):
        return self.desc0 + self.o.Int64(((j * 8 + 2 * s) * 128) >> 4)

    # ---- the program ----------------------------------------------------------------
    def preload(self):
        """Before the PDL wait: the weights and block scales of the first depth K blocks."""
        return [self.load_w(j) for j in range(self.D)], [self.load_sb(j) for j in range(self.D)]

    def promote(self, acc, d, sa, sb):
        """acc += d * sa[token] * sb (block kinds; factor 1 otherwise)."""
        o = self.o
        d = o.fence_regs(d)
        for q in range(len(acc)):
            f = sa[(q // 4) * 2 + q % 2] if self.A == 2 else None
            if self.B == 2:
                f = sb if f is None else f * sb
            acc[q] = acc[q] + (d[q] if f is None else d[q] * f)
        return acc

    def run(self, pre):
        o = self.o
        ws, sbs = pre
        o.fence_async()
        o.bar_wg(self.bar_id)  # every thread's staged x, visible to the async proxy
        # the fragments of the weights loaded before the wait are gathered here, not above the
        # wait (where gathering waits for the loads and delays the x staging behind them)
        frags = [[o.pass_regs(self.frag(wv, s)) for s in range(4)] for wv in ws]
        saq = [self.load_sa(j) for j in range(min(SA_AHEAD, self.KPW))]
        acc = [o.Float32(0.0)] * (self.MT // 2)
        prev = None
        for j in range(self.KPW):
            if j + SA_AHEAD < self.KPW:
                saq.append(self.load_sa(j + SA_AHEAD))
            o.wg_fence()
            d = [o.Float32(0.0)] * (self.MT // 2)
            for s in range(4):
                a = frags[j][s] if j < len(frags) else self.frag(ws[j], s)
                d = o.wgmma(a, self.desc(j, s), d, s == 0)
            o.wg_commit()
            if prev is not None:
                o.wg_wait(1)  # block j - 1's wgmma are done: its registers are free
                o.keep_regs(self._a_regs(frags, ws, j - 1))
                acc = self.promote(acc, prev, saq[j - 1], sbs[j - 1])
                ws[j - 1] = saq[j - 1] = None
                if j - 1 + self.D < self.KPW:
                    ws.append(self.load_w(j - 1 + self.D))
                    sbs.append(self.load_sb(j - 1 + self.D))
            prev = d
        o.wg_wait(0)
        o.keep_regs(self._a_regs(frags, ws, self.KPW - 1))
        return self.promote(acc, prev, saq[self.KPW - 1], sbs[self.KPW - 1])

    @staticmethod
    def _a_regs(frags, ws, j):
        """The registers block j's wgmma read as A."""
        if j < len(frags):
            return [v for fr in frags[j] for v in fr]
        return [v for vec in ws[j] for v in vec]

    # ---- epilogue geometry ----------------------------------------------------------
    def entries(self, g, t):
        """(accumulator index, token m, row in the tile) of each value of thread (g, t), g the
        row given to setup_weights (the m64nN D fragment: d[4i + e] = D[g + 8 (e // 2), 8i +
        2t + e % 2])."""
        return [(q, 8 * (q // 4) + 2 * t + q % 2, g + 8 * ((q % 4) // 2)) for q in range(self.MT // 2)]

    def red_slot(self, wk, row, m):
        return wk * self.out_blk + m * ROWS + row

    def share_slots(self, rank, tid, nthr: int):
        """ks > 1: (j, output index) of the outputs thread tid of cluster block `rank` finishes,
        one per pass of nthr: j < share are its share's rank * share + j; the rest are clamped to
        the share's last output and not stored."""
        return [(tid + p * nthr, rank * self.share + self.o.imin(tid + p * nthr, self.share - 1))
                for p in range(-(-self.share // nthr))]

    def out_coord(self, tile, idx):
        """(token m, column) of output idx (0 <= idx < out_blk) of 64-row tile `tile`."""
        return idx // ROWS, tile * ROWS + idx % ROWS
