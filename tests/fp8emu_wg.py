"""CPU emulator of the warpgroup fp8 GEMM (Fp8Config.wg): runs executors.cute.fp8_wg.WgProgram
on numpy vectors of a warpgroup's 128 threads. wgmma builds A[64, 32] from the threads' register
fragments (warp w, lane (g, t): a0 / a2 = A[16w + g, 4t:4t+4] / [16 + 4t:20 + 4t], a1 / a3 the
same of row 16w + g + 8, bytes low first), reads B through its shared-memory matrix descriptor as
the PTX ISA's canonical K-major layout without swizzle defines it (byte (row, k) at start +
(row % 8) * 16 + (row // 8) * SBO + k % 16 + (k // 16) * LBO) and returns the accumulator
fragment of m64nNk32 (d[4i + e] = D[16w + g + 8 (e // 2), 8i + 2t + e % 2]). A cp.async copy lands
only when a cp.async.wait_group covers its group; wgmma refuses bytes that have not landed, been
fenced to the async proxy and then met the warpgroup's barrier (shared loads of x alike), and a
copy into bytes that a wgmma group not yet waited for reads, or that a thread read before the
last barrier, is refused; each warpgroup's ring must lie apart from the others'.

Not modelled: the four warps' progress within a warpgroup (the 128 threads run in lockstep, so a
missing second barrier or a wait that only some warps passed goes unseen), wgmma.fence (a no-op
here), and the kernel's epilogue, which is rebuilt from the program's index helpers as in
tests/fp8emu.py; the GPU tests cover those."""

from __future__ import annotations

import numpy as np

from executors.cute.fp8 import Fp8Config
from executors.cute.fp8_lane import acc_entries
from executors.cute.fp8_wg import DESC_START_MASK, WgProgram
from tests.fp8emu import Memory, NumpyOps, Outputs, e4m3_values, reduced_outputs

WLANES = np.arange(128)
WG, WT = WLANES % 32 // 4, WLANES % 4
LANDED, FENCED = 2, 3  # byte states past "in flight" (1)


def decode_desc(desc) -> tuple[int, int, int]:
    d = np.unique(np.asarray(desc, dtype=np.int64))
    assert d.size == 1, "a descriptor must be the same in every thread of the warpgroup"
    d = int(d[0])
    assert d >> 62 == 0 and (d >> 49) & 7 == 0, "layout type / base offset: no swizzle expected"
    return (d & DESC_START_MASK) << 4, ((d >> 16) & 0x3FFF) << 4, ((d >> 32) & 0x3FFF) << 4


class WgOps(NumpyOps):
    LANES = 128  # a warpgroup

    def __init__(self, mem: Memory):
        super().__init__(mem)
        self.wgmma_calls = 0

    def new_block(self, smem_bytes: int):
        super().new_block(smem_bytes)
        self.state = np.zeros(self.smem.size, dtype=np.int8)
        self.gvis = np.zeros(self.smem.size, dtype=bool)  # landed, then a barrier: shared loads
        self.avis = np.zeros(self.smem.size, dtype=bool)  # fenced, then a barrier: wgmma
        self.open_cp, self.cp_groups = [], []
        self.open_reads, self.wg_groups = np.zeros(self.smem.size, dtype=bool), []

    # ---- copies -------------------------------------------------------------------
    def cp_async(self, dst, src, idx, limit):
        d_all, s_all = self._vec(dst), self._vec(src)
        for lane in self._lanes(idx, limit):
            d, s = int(d_all[lane]), int(s_all[lane])
            assert d % 16 == 0 and 0 < d and d + 16 <= self.smem.size, f"cp.async into smem {d}"
            span = slice(d, d + 16)
            assert (self.state[span] != 1).all(), "two copies in flight into the same bytes"
            assert not self.read_unsynced[span].any(), "copy into bytes read before the last barrier"
            for reads in self.wg_groups + [self.open_reads]:
                assert not reads[span].any(), "copy into bytes a pending wgmma reads"
            self.open_cp.append((d, self.mem.read(np.array([s]), 16)[0].copy()))
            self.state[span] = 1
            self.gvis[span] = self.avis[span] = False

    def cp_commit(self):
        self.cp_groups.append(self.open_cp)
        self.open_cp = []

    def cp_wait(self, n):
        keep = self.cp_groups[len(self.cp_groups) - n:] if n else []
        for grp in self.cp_groups[:len(self.cp_groups) - n]:
            for d, data in grp:
                self.smem[d:d + 16] = data
                self.state[d:d + 16] = LANDED
        self.cp_groups = keep

    def fence_async(self):
        self.state[self.state == LANDED] = FENCED

    def bar_wg(self, bar_id):
        assert np.unique(self._vec(bar_id)).size == 1, "one named barrier per warpgroup"
        self.gvis |= self.state >= LANDED
        self.avis |= self.state == FENCED
        self.read_unsynced[:] = False

    # ---- wgmma --------------------------------------------------------------------
    @staticmethod
    def make_desc(addr, bits):
        return (np.asarray(addr, dtype=np.int64) >> 4 & DESC_START_MASK) | np.int64(bits)

    def _operand_b(self, desc, rows: int):
        start, lbo, sbo = decode_desc(desc)
        r = np.arange(rows)[:, None]
        k = np.arange(32)[None, :]
        addr = start + (r % 8) * 16 + (r // 8) * sbo + k % 16 + (k // 16) * lbo
        assert (addr >= 0).all() and (addr < self.smem.size).all(), "wgmma operand outside smem"
        assert self.avis[addr].all(), (
            "wgmma reads bytes not landed, fenced to the async proxy and past the barrier")
        self.open_reads[addr.reshape(-1)] = True
        return e4m3_values(self.smem[addr])

    @staticmethod
    def _operand_a(a):
        A = np.zeros((64, 32), dtype=np.uint8)
        w = WLANES // 32
        for reg, (dr, dk) in enumerate(((0, 0), (8, 0), (0, 16), (8, 16))):
            word = np.broadcast_to(np.asarray(a[reg], dtype=np.int64), (128,)) & 0xFFFFFFFF
            for i in range(4):
                A[16 * w + WG + dr, dk + 4 * WT + i] = (word >> (8 * i)) & 0xFF
        return e4m3_values(A)

    def wg_fence(self):
        pass

    def ld_smem32(self, addr):
        a = self._vec(addr)
        assert (a % 4 == 0).all() and (a > 0).all() and (a + 4 <= self.smem.size).all()
        idx = a[:, None] + np.arange(4)
        assert self.gvis[idx].all(), "shared load of bytes not landed and past the barrier"
        self.read_unsynced[idx] = True
        return self.smem[idx].copy().view("<u4").astype(np.int64).reshape(128)

    def wgmma(self, a, db, d, fresh):
        self.wgmma_calls += 1
        n = 2 * len(d)
        A = self._operand_a(a)
        B = self._operand_b(db, n)
        D = A @ B.T
        w = WLANES // 32
        out = []
        for idx in range(len(d)):
            i, e = idx // 4, idx % 4
            v = D[16 * w + WG + 8 * (e // 2), 8 * i + 2 * WT + e % 2]
            base = 0.0 if fresh else np.broadcast_to(np.asarray(d[idx], dtype=np.float64), (128,))
            out.append((base + v).astype(np.float32))
        return out

    def wg_commit(self):
        self.wg_groups.append(self.open_reads)
        self.open_reads = np.zeros(self.smem.size, dtype=bool)

    def wg_wait(self, n):
        self.wg_groups = self.wg_groups[len(self.wg_groups) - n:] if n else []

    @staticmethod
    def keep_regs(vals):
        pass

    @staticmethod
    def fence_regs(vals):
        return list(vals)

    pass_regs = fence_regs


def place_operands(x_u8, w_u8, sa, sb):
    """(memory, x, w, scale_a, scale_b addresses): the operands and scales row-major in a fresh
    emulated device memory."""
    mem = Memory(1024 + x_u8.size + w_u8.size + 4 * (sa.size + sb.size) + 4 * 256)
    k = x_u8.shape[1]
    return (mem, mem.put_strided(x_u8, (k, 1), 1), mem.put_strided(w_u8, (k, 1), 1),
            mem.put_strided(sa.astype(np.float32), (sa.shape[1], 1), 4),
            mem.put_strided(sb.astype(np.float32), (sb.shape[1], 1), 4))


class _SkipFence:
    """An ops namespace without the async-proxy fence (the others passed through)."""

    def __init__(self, ops):
        self._ops = ops

    def fence_async(self):
        pass

    def __getattr__(self, name):
        return getattr(self._ops, name)


def without_fence(program):
    """A negative control: `program` whose run() never fences its shared-memory writes to the
    async proxy."""
    class NoFence(program):
        def run(self, pre):
            self.o = _SkipFence(self.o)
            return super().run(pre)

    return NoFence


def emulate_wg(cfg: Fp8Config, x_u8, w_u8, sa, sb, a: int, b: int, program=WgProgram):
    """out[M, N] (fp32) as the warpgroup kernel computes it (row-major operands and scales)."""
    m, k = x_u8.shape
    n = w_u8.shape[0]
    assert cfg.wg and cfg.check(m, n, k) is None, cfg.check(m, n, k)
    mem, x_base, w_base, sa_base, sb_base = place_operands(x_u8, w_u8, sa, sb)
    ops = WgOps(mem)
    outs = Outputs(m, n)
    R, WK, MT = cfg.tiles, cfg.warps_k, cfg.m_tile
    owner = WLANES < 32  # warp 0 of the warpgroup holds the token rows

    for bid in range(cfg.grid(n)):
        ops.new_block(128 + cfg.smem_bytes())
        red = np.full(WK * R * MT * 8, np.nan, dtype=np.float32)
        ln = None
        for wk in range(WK):
            n_tile0 = bid * 8 * R
            ln = program(ops, cfg, n, k, a, b)
            ln.setup_weights(w_base, n_tile0, WG, WT, wk, sb_base, sb.shape[1], 1)
            ln.setup_wg(np.int64(128), WLANES, wk + 1)
            # each warpgroup's ring inside the block's rings and apart from the others'
            lo = int(np.unique(np.asarray(ln.ring))[0])
            ops.claim(lo, lo + cfg.bulk * ln.stage_bytes)
            assert lo + cfg.bulk * ln.stage_bytes <= 128 + WK * cfg.bulk * ln.stage_bytes
            pre = ln.preload()
            ln.setup_acts(x_base, k, m, WG, WT, sa_base, sa.shape[1], 1)
            acc = ln.run(pre)
            assert not ops.cp_groups and not ops.open_cp, "copies never waited for"
            for r, e, mm, c8 in acc_entries(R, MT, WG, WT):
                if WK == 1:
                    col = n_tile0 + r * 8 + c8
                    outs.store(mm, col, ln.final(acc[r][e], np.minimum(mm, m - 1), np.minimum(col, n - 1)), owner)
                else:
                    slot = ln.red_slot(wk, 0, r, mm, c8)[owner]
                    assert np.isnan(red[slot]).all(), "two values for one reduction slot"
                    red[slot] = np.asarray(acc[r][e])[owner]
        if WK > 1:
            for mm, col, v in reduced_outputs(ln, red, WK, cfg.threads(), bid, m, n):
                outs.store(mm, col, v)
    return outs.result(), ops.wgmma_calls
