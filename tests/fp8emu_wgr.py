"""CPU emulator of the register-weights warpgroup fp8 GEMM (Fp8Config.wgr): runs
executors.cute.fp8_wgr.WgrProgram on numpy vectors of a warpgroup's 128 threads with the wgmma
of tests/fp8emu_wg.py (A from the register fragments, here the weights; B through its
shared-memory descriptor, here the staged x). A 4-byte shared store lands at once for the
generic proxy; wgmma refuses bytes not fenced to the async proxy and then past the warpgroup's
barrier, and a store into bytes a wgmma group not yet waited for reads. Each warpgroup's x region
must lie apart from the others'. Not modelled, as in fp8emu_wg: the warps' progress within a
warpgroup, wgmma.fence, and register reuse under an in-flight wgmma (the program keeps the A
registers live past the wait; the GPU tests cover it). The epilogue is rebuilt from the program's
index helpers."""

from __future__ import annotations

import numpy as np

from executors.cute.fp8 import Fp8Config
from executors.cute.fp8_wgr import WgrProgram
from tests.fp8emu import Outputs, reduced_outputs
from tests.fp8emu_wg import LANDED, WG, WLANES, WT, WgOps, place_operands

ROW_G = 16 * (WLANES // 32) + WG  # a thread's row in the 64-row tile


class WgrOps(WgOps):
    def st_smem32(self, addr, val):
        a = self._vec(addr)
        v = np.broadcast_to(np.asarray(val, dtype=np.int64), (self.LANES,)) & 0xFFFFFFFF
        assert (a % 4 == 0).all() and (a > 0).all() and (a + 4 <= self.smem.size).all(), "st.shared out of range"
        idx = a[:, None] + np.arange(4)
        for reads in self.wg_groups + [self.open_reads]:
            assert not reads[idx].any(), "store into bytes a pending wgmma reads"
        self.smem[idx] = (v[:, None] >> (8 * np.arange(4))) & 0xFF
        self.state[idx] = LANDED
        self.gvis[idx] = self.avis[idx] = False


def emulate_wgr(cfg: Fp8Config, x_u8, w_u8, sa, sb, a: int, b: int, program=WgrProgram):
    """out[M, N] (fp32) as the kernel computes it (row-major operands and scales); and the wgmma
    count."""
    m, k = x_u8.shape
    n = w_u8.shape[0]
    assert cfg.wgr and cfg.check(m, n, k) is None, cfg.check(m, n, k)
    mem, x_base, w_base, sa_base, sb_base = place_operands(x_u8, w_u8, sa, sb)
    ops = WgrOps(mem)
    outs = Outputs(m, n)
    WK, KS = cfg.warps_k, cfg.ks
    parts = []  # the block sums of the cluster being run (ks > 1)
    for bid in range(cfg.grid(n)):
        tile, rank = bid // KS, bid % KS
        ops.new_block(128 + cfg.smem_bytes())
        red = np.full(WK * 64 * cfg.m_tile, np.nan, dtype=np.float32)
        ln = None
        for wk in range(WK):
            ln = program(ops, cfg, n, k, a, b)
            ln.setup_weights(w_base, tile * 64, ROW_G, WT, wk, sb_base, sb.shape[1], 1, rank)
            ln.setup_wg(np.int64(128), WLANES, wk + 1)
            lo = int(np.unique(np.asarray(ln.region))[0])
            ops.claim(lo, lo + ln.x_bytes)
            pre = ln.preload()
            ln.setup_acts(x_base, k, m, ROW_G, WT, sa_base, sa.shape[1], 1)
            acc = ln.run(pre)
            assert not ops.wg_groups, "wgmma groups never waited for"
            for e, mm, row in ln.entries(ROW_G, WT):
                if WK == 1 and KS == 1:
                    col = tile * 64 + row
                    outs.store(mm, col, ln.final(acc[e], np.minimum(mm, m - 1), np.minimum(col, n - 1)))
                else:
                    slot = ln.red_slot(wk, row, mm)
                    assert np.isnan(red[slot]).all(), "two values for one reduction slot"
                    red[slot] = acc[e]
        if KS > 1:  # the block's sums (wk order), then the cluster's: rank order, as the kernel
            assert not np.isnan(red).any(), "reduction slot never written"
            parts.append(sum(red[q * ln.out_blk:(q + 1) * ln.out_blk] for q in range(WK)).astype(np.float32))
            if rank == KS - 1:  # every block of the cluster finishes its share from all sums
                for r in range(KS):
                    for j, idx in ln.share_slots(r, np.arange(cfg.threads()), cfg.threads()):
                        s = np.zeros(idx.shape, dtype=np.float32)
                        for q in range(KS):
                            s = (s + parts[q][idx]).astype(np.float32)
                        mm, col = ln.out_coord(tile, idx)
                        v = np.broadcast_to(ln.final(s, np.minimum(mm, m - 1), np.minimum(col, n - 1)), idx.shape)
                        ok = j < ln.share
                        outs.store(mm[ok], col[ok], v[ok])
                parts = []
        elif WK > 1:
            for mm, col, v in reduced_outputs(ln, red, WK, cfg.threads(), bid, m, n):
                outs.store(mm, col, v)
    return outs.result(), ops.wgmma_calls
