"""The warpgroup program of the fp8 skinny GEMM (Fp8Config.wg), written once over an ``ops``
namespace like fp8_lane.LaneProgram: fp8_kernels.py traces it with CuTe DSL values and inline
PTX (executors/cute/ptx_wg.py), tests/fp8emu_wg.py runs it on numpy vectors of a warpgroup's 128
threads with wgmma emulated from its register fragment and shared-memory matrix descriptor.

Hopper's fp8 tensor cores are reached only through wgmma (mma.sync e4m3 is lowered to f16
conversions plus f16 mma, which is what the lane program does by hand): no conversion per byte,
no f16 mma. Transposed problem: D[64, NW] = X[64, K] . W[NW, K]^T, the tokens are wgmma's M (64
rows; every warp of the warpgroup holds the x rows g and g + 8, clamped to M - 1, as the A
fragment of its 16 rows, so rows 16..63 repeat rows 0..15 and only warp 0's are stored), a
warpgroup's NW = 8 * tiles weight rows are its N.

Each warpgroup streams its K range through a ring of S = ``bulk`` shared-memory stages, one per
iteration (``unroll`` K blocks). A stage holds B, the weights, in the K-major canonical layout
without swizzle (16-byte piece (row n, chunk c) at (n // 8) * SBO + c * 128 + (n % 8) * 16,
SBO = 8 * unroll * 128, the leading (K) offset 128), then the m_tile x rows of the same K blocks
(row m at m * (unroll * 128 + 16)). A comes from registers: per 32-wide K step, lane (g, t)
reads from the stage the 4-byte words at K offsets 4t and 16 + 4t of rows g (a0, a2) and g + 8
(a1, a3; zeros at m_tile 8).

Every thread copies 16-byte pieces with cp.async: the first S stages' weights before the PDL
wait (one commit group each), their x rows right after it (x is the previous kernel's output),
later stages' weights and x together. Iteration it waits for its stage's groups, fences them to
the async proxy and meets the warpgroup's named barrier, reads its A fragments, issues
4 * unroll wgmma m64nNWk32 (each K block into a fresh partial) and commits them; then waits for
the previous iteration's group, promotes its partials with the block scales (fp8_lane's
promote; the activation and weight scales are loaded xahead iterations ahead) and, after a
second barrier, refills the previous iteration's stage with iteration it - 1 + S.

Measured on an H200 (results/gpu_2026-12-02.md): correct at every shape and M swept, and 1.6-3x
slower than the lane program's table rows, so no default uses it; the per-block timeline puts
its time in the K loop (about 0.6 us per iteration at qkv_a, M = 8), not in waves or the release.
"""

from __future__ import annotations

from .fp8_config import BLOCK, Fp8Config
from .fp8_lane import LaneProgram

DESC_START_MASK = 0x3FFF  # a descriptor's start address: 14 bits of (shared address >> 4)


def desc_bits(lbo: int, sbo: int) -> int:
    """The constant part of a shared-memory matrix descriptor without swizzle (layout type 0,
    base offset 0): the leading (K-direction) byte offset in bits 16..29, the stride byte offset
    (between 8-row groups) in bits 32..45, both in 16-byte units."""
    assert lbo % 16 == 0 and sbo % 16 == 0 and lbo >> 4 < 1 << 14 and sbo >> 4 < 1 << 14
    return ((lbo >> 4) << 16) | ((sbo >> 4) << 32)


class WgProgram(LaneProgram):
    def __init__(self, ops, cfg: Fp8Config, n: int, k: int, a: int, b: int):
        super().__init__(ops, cfg, n, k, a, b)
        self.NW = 8 * self.R
        self.w_bytes = self.NW * self.U * BLOCK  # a stage's weights, then its x rows
        self.xrow = cfg.wg_x_row_bytes()
        self.stage_bytes = cfg.wg_stage_bytes()
        self.sbo_w = 8 * self.U * BLOCK
        self.pieces_w = self.NW * self.U * 8  # 16-byte pieces of one stage's weights

    # ---- set-up ---------------------------------------------------------------------
    def setup_wg(self, ring, wtid, bar_id):
        """This warpgroup's ring (shared address of the block's rings), its thread index
        0..127 and named barrier."""
        o = self.o
        self.wtid, self.bar_id = wtid, bar_id
        self.ring = ring + self.wk * o.Int32(self.S * self.stage_bytes)
        self.desc_w0 = o.make_desc(self.ring, desc_bits(128, self.sbo_w))
        # weights: thread wtid copies row wtid % NW of chunks wtid // NW + i * (128 // NW)
        row = wtid % self.NW
        self.w_chunk0 = wtid // self.NW
        self.w_src = self.w_base + o.Int64(o.imin(self.n_tile0 + row, self.N - 1)) * self.K
        self.w_dst = self.ring + (row // 8) * o.Int32(self.sbo_w) + (row % 8) * o.Int32(16)

    def setup_acts(self, x_base, sx, m_rows, g, t, sa_base, sas0, sas1):
        super().setup_acts(x_base, sx, m_rows, g, t, sa_base, sas0, sas1)
        o = self.o
        # x: thread wtid copies token row wtid % m_tile (clamped to M - 1) of chunks
        # wtid // m_tile + i * (128 // m_tile)
        m = self.wtid % self.MT
        self.x_chunk0 = self.wtid // self.MT
        self.x_src = x_base + o.Int64(o.imin(m, m_rows - 1)) * o.Int64(sx)
        self.x_dst = self.ring + o.Int32(self.w_bytes) + m * o.Int32(self.xrow)
        # A fragments: lane (g, t) reads rows g, g + 8 at 4t (+16) of each 32-wide K step
        self.xa_g = self.ring + o.Int32(self.w_bytes) + g * o.Int32(self.xrow) + t * o.Int32(4)
        self.xa_h = self.xa_g + o.Int32(8 * self.xrow)

    # ---- copies -----------------------------------------------------------------------
    def _kb_of_local(self, j):
        """K block of local K block j (= it * unroll + u) of this warpgroup, j an int or a lane
        value."""
        if self.KI:
            return (j // self.U * self.WK + self.wk) * self.U + j % self.U
        return self.wk * (self.NIT * self.U) + j

    def issue_w(self, it):
        """Copies of iteration it's weights into stage it % S."""
        o = self.o
        s = it % self.S
        step = 128 // self.NW  # chunks between one thread's pieces
        for i in range(-(-self.pieces_w // 128)):
            c = self.w_chunk0 + i * step  # chunk of the stage: u = c // 8, 16-byte column c % 8
            kb = self._kb_of_local(it * self.U + c // 8)
            src = self.w_src + o.Int64(kb * BLOCK + (c % 8) * 16)
            dst = self.w_dst + o.Int32(s * self.stage_bytes) + c * o.Int32(128)
            o.cp_async(dst, src, c, 8 * self.U)

    def issue_x(self, it):
        """Copies of iteration it's x rows (unroll K blocks of each) into stage it % S."""
        o = self.o
        s = it % self.S
        step = 128 // self.MT
        for i in range(-(-self.MT * self.U * 8 // 128)):
            c = self.x_chunk0 + i * step
            kb = self._kb_of_local(it * self.U + c // 8)
            src = self.x_src + o.Int64(kb * BLOCK + (c % 8) * 16)
            o.cp_async(self.x_dst + o.Int32(s * self.stage_bytes) + c * o.Int32(16), src, c, 8 * self.U)

    def load_xa(self, it):
        """A fragments of iteration it from its stage, index u * 4 + j (32-wide K step j of
        unroll step u)."""
        o = self.o
        out = []
        base = o.Int32((it % self.S) * self.stage_bytes)
        for u in range(self.U):
            for j in range(4):
                off = [base + o.Int32(u * BLOCK + 32 * j + 16 * h) for h in range(2)]
                g0, g1 = o.ld_smem32(self.xa_g + off[0]), o.ld_smem32(self.xa_g + off[1])
                if self.MT == 16:
                    h0, h1 = o.ld_smem32(self.xa_h + off[0]), o.ld_smem32(self.xa_h + off[1])
                else:
                    h0 = h1 = o.Int32(0)
                out.append([g0, h0, g1, h1])
        return out

    # ---- the program ------------------------------------------------------------------
    def _commit(self, *labels):
        self.o.cp_commit()
        self.groups.append(set(labels))

    def preload(self):
        """Before the PDL wait: the first S iterations' weights (one commit group each) and the
        first iterations' weight scales."""
        self.groups = []
        for i in range(self.first):
            self.issue_w(i)
            self._commit(("w", i))
        return None, [self.load_sb(i) for i in range(min(self.XA, self.NIT))]

    def _wait_for(self, *labels):
        """cp.async.wait_group for the newest group holding one of these copies."""
        newest = max(i for i, grp in enumerate(self.groups) if grp & set(labels))
        self.o.cp_wait(len(self.groups) - 1 - newest)

    def _issue_mma(self, it, xa):
        """Iteration it's wgmma: per unroll step a fresh partial over its 4 k32 steps."""
        o = self.o
        parts = []
        s = it % self.S
        for u in range(self.U):
            d = [o.Float32(0.0)] * (4 * self.R)
            for j in range(4):
                db = self.desc_w0 + o.Int64((s * self.stage_bytes + (u * 8 + 2 * j) * 128) >> 4)
                d = o.wgmma(xa[u * 4 + j], db, d, j == 0)
            parts.append(d)
        o.wg_commit()
        return parts

    def _promote_parts(self, acc, parts, sa, sb):
        o = self.o
        for u in range(self.U):
            d = o.fence_regs(parts[u])
            ph = [d[4 * r:4 * r + 4] for r in range(self.R)]
            acc = self.promote(acc, ph, None, sa, sb, u)
        return acc

    def run(self, pre):
        o = self.o
        sbq = pre[1]
        for i in range(self.first):  # x is the previous kernel's output: its first stages now
            self.issue_x(i)
            self._commit(("x", i))
        saq = [self.load_sa(i) for i in range(min(self.XA, self.NIT))]
        acc = [[o.Float32(0.0)] * 4 for _ in range(self.R)]
        prev = None
        for it in range(self.NIT):
            self._wait_for(("w", it), ("x", it))
            o.fence_async()
            o.bar_wg(self.bar_id)
            if it + self.XA < self.NIT:
                sbq.append(self.load_sb(it + self.XA))
                saq.append(self.load_sa(it + self.XA))
            xa = self.load_xa(it)
            o.wg_fence()
            parts = self._issue_mma(it, xa)
            if prev is not None:
                o.wg_wait(1)  # the previous iteration's wgmma are done
                o.keep_regs([v for frag in prev[0] for v in frag])  # their A registers too
                acc = self._promote_parts(acc, *prev[1:])
                o.bar_wg(self.bar_id)  # every warp is past its reads of that stage
                if it - 1 + self.S < self.NIT:
                    self.issue_w(it - 1 + self.S)
                    self.issue_x(it - 1 + self.S)
                    self._commit(("w", it - 1 + self.S), ("x", it - 1 + self.S))
            prev = (xa, parts, saq[it], sbq[it])
            saq[it] = sbq[it] = None
        o.wg_wait(0)
        o.keep_regs([v for frag in prev[0] for v in frag])
        return self._promote_parts(acc, *prev[1:])
