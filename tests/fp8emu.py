"""CPU emulator of the fp8 skinny GEMM: runs executors.cute.fp8_lane.LaneProgram (the code the
kernel traces) on numpy vectors of a warp's 32 lanes, over a flat byte "device memory", with the
mma.sync m16n8k16 f16 fragment layout of the PTX ISA emulated across lanes, and the kernel's
epilogue (direct stores, or the shared-memory reduction over warps_k) rebuilt from the program's
own index helpers. Every load is checked for alignment and bounds, every output for being
written exactly once. The bulk ring (Fp8Config.bulk) runs on an emulated shared memory: a bulk
copy's bytes land only when a wait on its mbarrier's phase returns, a wait checks the phase's
parity and that its byte count was armed and met, a read of bytes still in flight is refused,
and so are a copy over landed bytes no lane has read yet or over bytes read since the last warp
sync, a barrier used before the init fence, and two warps' rings or barriers that overlap."""

from __future__ import annotations

import numpy as np
import torch

from executors.cute.fp8 import Fp8Config, bits_words
from executors.cute.fp8_lane import LaneProgram, acc_entries

LANES = np.arange(32)
G, T = LANES // 4, LANES % 4


def _e4m3_to_f16_bits() -> np.ndarray:
    v = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    return v.to(torch.float16).view(torch.int16).numpy().astype(np.int64) & 0xFFFF


E4M3_F16 = _e4m3_to_f16_bits()


def e4m3_values(b) -> np.ndarray:
    """The values of e4m3 bytes (a uint8 array) as float64."""
    return E4M3_F16[np.asarray(b)].astype(np.uint16).view(np.float16).astype(np.float64)


def f16_halves(word):
    """(low, high) f16 values of 32-bit words (int64 arrays) as float64."""
    w = np.asarray(word, dtype=np.int64) & 0xFFFFFFFF
    lo = (w & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
    hi = (w >> 16).astype(np.uint16).view(np.float16).astype(np.float64)
    return lo, hi


class Memory:
    """Flat little-endian byte memory with 256-byte aligned allocations."""

    def __init__(self, nbytes: int):
        self.buf = np.zeros(nbytes, dtype=np.uint8)
        self.top = 256  # address 0 stays unused

    def alloc(self, nbytes: int) -> int:
        base = self.top
        self.top = (self.top + nbytes + 255) // 256 * 256
        assert self.top <= self.buf.size, "emulator memory too small"
        return base

    def put_strided(self, arr: np.ndarray, strides, elem: int) -> int:
        """Store a 2-D array with the given element strides; returns its base address."""
        rows, cols = arr.shape
        span = (rows - 1) * strides[0] + (cols - 1) * strides[1] + 1
        base = self.alloc(span * elem)
        raw = arr.reshape(rows, cols, 1).view(np.uint8).reshape(rows, cols, elem)
        for i in range(rows):
            for j in range(cols):
                a = base + (i * strides[0] + j * strides[1]) * elem
                self.buf[a:a + elem] = raw[i, j]
        return base

    def read(self, addr, nbytes: int, align: int | None = None) -> np.ndarray:
        """nbytes at each address, which must be aligned to `align` (default: nbytes)."""
        a = np.asarray(addr, dtype=np.int64).reshape(-1)
        al = align or nbytes
        assert (a % al == 0).all(), f"misaligned {nbytes}-byte load at {a[a % al != 0][:4]}"
        assert (a > 0).all() and (a + nbytes <= self.top).all(), "load out of bounds"
        return self.buf[a[:, None] + np.arange(nbytes)]


class Outputs:
    """An emulated kernel's out[M, N] (NaN until written) and how often each element was written."""

    def __init__(self, m: int, n: int):
        self.out = np.full((m, n), np.nan, dtype=np.float32)
        self.writes = np.zeros((m, n), dtype=np.int64)

    def store(self, mm, col, v, lanes=None):
        """Values v at (token mm, column col) where both lie inside out (and `lanes` holds)."""
        m, n = self.out.shape
        ok = (mm < m) & (col < n)
        if lanes is not None:
            ok = ok & lanes
        np.add.at(self.writes, (mm[ok], col[ok]), 1)
        self.out[mm[ok], col[ok]] = np.broadcast_to(v, mm.shape)[ok]

    def result(self) -> np.ndarray:
        w = self.writes
        assert (w == 1).all(), f"outputs written {w.min()}..{w.max()} times"
        return self.out


class NumpyOps:
    """LaneProgram's ops on numpy lane vectors (words: int64 arrays holding uint32 values)."""

    LANES = 32  # threads one program runs for (a warp)

    def __init__(self, mem: Memory):
        self.mem = mem
        self.mma_calls = 0
        self.prefetched = []  # (address, bytes) of every L2 prefetch, in issue order
        self.waited = False  # past the PDL wait (setup_acts): prefetches belong before it
        self.new_block(0)

    # ---- shared memory, mbarriers and bulk copies (the bulk ring) ----------------------
    def new_block(self, smem_bytes: int):
        self.smem = np.zeros(max(smem_bytes, 16), dtype=np.uint8)
        self.inflight = np.zeros(self.smem.size, dtype=bool)  # copied, not landed
        self.unread = np.zeros(self.smem.size, dtype=bool)  # landed, not read since
        self.read_unsynced = np.zeros(self.smem.size, dtype=bool)  # read since the last warp sync
        self.bars = {}  # address -> dict(phase, armed, tx, copies)
        self.unfenced = False  # barriers initialised, init fence not yet passed
        self.owned = []  # (start, end) of each warp's ring and barriers

    def prefetch_l2(self, addr, nbytes, idx, limit):
        nb = self._one(nbytes, 0)
        assert not self.waited, "L2 prefetch after the PDL wait"
        assert nb % 16 == 0 and nb > 0, f"bulk prefetch of {nb} bytes"
        for lane in self._lanes(idx, limit):
            a = self._one(addr, lane)
            self.mem.read(np.array([a]), nb, align=16)  # aligned, inside memory
            self.prefetched.append((a, nb))

    def _lanes(self, idx, limit):
        """The lanes (threads) where idx < limit."""
        return np.nonzero(np.broadcast_to(np.asarray(idx) < limit, (self.LANES,)))[0]

    def _vec(self, v):
        """v as one int64 value per lane."""
        return np.broadcast_to(np.asarray(v, dtype=np.int64), (self.LANES,))

    def _one(self, v, lane):
        return int(self._vec(v)[lane])

    def mbar_init(self, bar, count, idx, limit):
        lanes = self._lanes(idx, limit)
        assert len(lanes) == 1 and count == 1, "one lane initialises each barrier for one arrival"
        b = self._one(bar, lanes[0])
        assert b % 8 == 0 and b + 8 <= self.smem.size and b not in self.bars, f"barrier at {b}"
        self.bars[b] = {"phase": 0, "armed": False, "tx": 0, "copies": []}
        self.unfenced = True

    def mbar_init_fence(self):
        self.unfenced = False

    def claim(self, start: int, end: int):
        """A warp's ring or barriers: inside shared memory and apart from every other warp's."""
        assert 0 < start <= end <= self.smem.size, f"[{start}, {end}) outside shared memory"
        assert all(end <= a or b <= start for a, b in self.owned), f"[{start}, {end}) overlaps another warp's"
        self.owned.append((start, end))

    def sync_warp(self):
        self.read_unsynced[:] = False

    def expect_tx(self, bar, nbytes, idx, limit):
        assert not self.unfenced, "barrier used before the init fence"
        lanes = self._lanes(idx, limit)
        assert len(lanes) == 1, "one lane arms a phase"
        st = self.bars[self._one(bar, lanes[0])]
        assert not st["armed"], "phase armed twice"
        st["armed"], st["tx"] = True, st["tx"] + nbytes

    def bulk(self, dst, src, nbytes, bar, idx, limit):
        assert nbytes % 16 == 0 and nbytes > 0
        for lane in self._lanes(idx, limit):
            d, s_, b = self._one(dst, lane), self._one(src, lane), self._one(bar, lane)
            assert d % 16 == 0, "bulk copy destination must be 16-byte aligned"
            assert 0 < d and d + nbytes <= self.smem.size, "bulk copy outside shared memory"
            span = slice(d, d + nbytes)
            assert not self.inflight[span].any(), "two copies in flight into the same bytes"
            assert not self.unread[span].any(), "copy over landed bytes nobody read"
            # other lanes' reads are ordered before this copy only by a warp sync
            assert not self.read_unsynced[span].any(), "copy over bytes read since the last warp sync"
            data = self.mem.read(np.array([s_]), nbytes, align=16)[0].copy()
            self.inflight[span] = True
            st = self.bars[b]
            st["copies"].append((d, data))
            st["tx"] -= nbytes

    def mbar_wait(self, bar, parity):
        assert not self.unfenced, "barrier used before the init fence"
        for b in {int(v) for v in self._vec(bar)}:
            st = self.bars[b]
            if st["phase"] % 2 != parity:  # that phase has completed before: no new bytes
                continue
            assert st["armed"] and st["tx"] == 0, f"phase {st['phase']} armed {st['armed']}, tx {st['tx']}"
            for d, data in st["copies"]:
                self.smem[d:d + data.size] = data
                self.inflight[d:d + data.size] = False
                self.unread[d:d + data.size] = True
            st.update(phase=st["phase"] + 1, armed=False, copies=[])

    def ld_smem(self, addr):
        a = self._vec(addr)
        assert (a % 16 == 0).all() and (a >= 0).all() and (a + 16 <= self.smem.size).all()
        idx = a[:, None] + np.arange(16)
        assert not self.inflight[idx].any(), "read of bytes still in flight"
        self.unread[idx] = False
        self.read_unsynced[idx] = True
        words = self.smem[idx].copy().view("<u4").astype(np.int64)
        return [words[:, j] for j in range(4)]

    @staticmethod
    def Int32(v):
        return np.asarray(v, dtype=np.int64)

    Int64 = Int32

    @staticmethod
    def Float32(v):
        return np.asarray(v, dtype=np.float32)

    @staticmethod
    def imin(a, b):
        return np.minimum(a, b)

    def _ld_v4(self, addr):
        words = self.mem.read(addr, 16).copy().view("<u4").astype(np.int64)
        return [words[:, j] for j in range(4)]

    ld_w = ld_x = _ld_v4

    def ld_f32(self, addr):
        return self.mem.read(addr, 4).copy().view("<f4").reshape(np.shape(addr))

    ld_f32_nc = ld_f32

    @staticmethod
    def cvt_hw(q):
        """cvt.rn.f16x2.e4m3x2 of each 16-bit half (PTX ISA: the low byte to the low half)."""
        q = np.asarray(q, dtype=np.int64) & 0xFFFFFFFF
        b = [(q >> (8 * i)) & 0xFF for i in range(4)]
        return [E4M3_F16[b[0]] | (E4M3_F16[b[1]] << 16), E4M3_F16[b[2]] | (E4M3_F16[b[3]] << 16)]

    @staticmethod
    def cvt_bits(q):
        d0, d1 = bits_words(np.asarray(q, dtype=np.int64))
        return [d0, d1]

    def mma(self, a, b, c):
        """mma.sync.m16n8k16.row.col.f32.f16.f16.f32 across the 32 lanes (PTX ISA fragments:
        a0 = A[g][2t:2t+2], a1 = A[g+8][2t:2t+2], a2 = A[g][2t+8:2t+10], a3 = A[g+8][2t+8:2t+10];
        b0 = B[2t:2t+2][g], b1 = B[2t+8:2t+10][g]; c = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1])."""
        self.mma_calls += 1
        A = np.zeros((16, 16))
        B = np.zeros((16, 8))
        for reg, (row, col) in enumerate(((G, 2 * T), (G + 8, 2 * T), (G, 2 * T + 8), (G + 8, 2 * T + 8))):
            lo, hi = f16_halves(np.broadcast_to(a[reg], (32,)))
            A[row, col], A[row, col + 1] = lo, hi
        for reg, krow in enumerate((2 * T, 2 * T + 8)):
            lo, hi = f16_halves(np.broadcast_to(b[reg], (32,)))
            B[krow, G], B[krow + 1, G] = lo, hi
        C = A @ B
        out = (C[G, 2 * T], C[G, 2 * T + 1], C[G + 8, 2 * T], C[G + 8, 2 * T + 1])
        return [(o + np.broadcast_to(np.asarray(ci, dtype=np.float64), (32,))).astype(np.float32)
                for o, ci in zip(out, c, strict=True)]


def emulate(cfg: Fp8Config, x_u8: np.ndarray, w_u8: np.ndarray, sa: np.ndarray, sb: np.ndarray,
            a: int, b: int, x_stride: int | None = None, sa_strides=None, sb_strides=None,
            prefetched: list | None = None):
    """out[M, N] (fp32, before any bf16 rounding) as the kernel computes it. a, b: scale kinds
    (0 tensor, 1 row/col, 2 block); sa, sb: 2-D fp32 arrays stored with the given element
    strides (default row-major); x stored with row stride x_stride (default K). `prefetched`
    (a list) receives (block, weight row, K block) of every byte range the L2 prefetches cover."""
    m, k = x_u8.shape
    n = w_u8.shape[0]
    assert cfg.check(m, n, k) is None, cfg.check(m, n, k)
    sx = x_stride or k
    sa_strides = sa_strides or (sa.shape[1], 1)
    sb_strides = sb_strides or (sb.shape[1], 1)
    def span(shape, strides, elem):
        return ((shape[0] - 1) * strides[0] + (shape[1] - 1) * strides[1] + 1) * elem + 256

    mem = Memory(256 + span((m, k), (sx, 1), 1) + span((n, k), (k, 1), 1)
                 + span(sa.shape, sa_strides, 4) + span(sb.shape, sb_strides, 4))
    x_base = mem.put_strided(x_u8, (sx, 1), 1)
    w_base = mem.put_strided(w_u8, (k, 1), 1)
    sa_base = mem.put_strided(sa.astype(np.float32), sa_strides, 4)
    sb_base = mem.put_strided(sb.astype(np.float32), sb_strides, 4)
    ops = NumpyOps(mem)
    outs = Outputs(m, n)
    R, WN, WK, MT = cfg.tiles, cfg.warps_n, cfg.warps_k, cfg.m_tile

    ring_bytes = WN * WK * cfg.bulk * cfg.bulk_stage_bytes()
    for bid in range(cfg.grid(n)):
        red = np.full(WK * WN * R * MT * 8, np.nan, dtype=np.float32)
        ops.new_block(128 + ring_bytes + 8 * WN * WK * cfg.bulk)
        ln = None
        for warp in range(WN * WK):
            wn, wk = warp % WN, warp // WN
            n_tile0 = (bid * WN + wn) * (8 * R)
            ln = LaneProgram(ops, cfg, n, k, a, b)
            ln.setup_weights(w_base, n_tile0, G, T, wk, sb_base, *sb_strides)
            if cfg.bulk:
                ln.setup_bulk(np.int64(128), np.int64(128 + ring_bytes), warp, LANES, G, T)
                ring0, bars0 = int(np.min(ln.ring)), int(np.min(ln.bars))
                ops.claim(ring0, ring0 + cfg.bulk * cfg.bulk_stage_bytes())
                ops.claim(bars0, bars0 + 8 * cfg.bulk)
            ops.prefetched, ops.waited = [], False
            pre = ln.preload()
            for addr, nb in ops.prefetched:
                off = addr - w_base
                assert 0 <= off and off + nb <= n * k, "L2 prefetch outside the weights"
                assert off % k + nb <= k, "L2 prefetch past the end of a weight row"
                assert off % 128 == 0 and nb % 128 == 0, "L2 prefetch of partial K blocks"
                if prefetched is not None:
                    prefetched += [(bid, off // k, off % k // 128 + j) for j in range(nb // 128)]
            ops.waited = True
            ln.setup_acts(x_base, sx, m, G, T, sa_base, *sa_strides)
            acc = ln.run(pre)
            for r, e, mm, c8 in acc_entries(R, MT, G, T):
                if WK == 1:
                    col = n_tile0 + r * 8 + c8
                    v = ln.final(acc[r][e], np.minimum(mm, m - 1), np.minimum(col, n - 1))
                    outs.store(mm, col, v)
                else:
                    slot = ln.red_slot(wk, wn, r, mm, c8)
                    assert np.isnan(red[slot]).all(), "two values for one reduction slot"
                    red[slot] = acc[r][e]
        if WK > 1:
            for mm, col, v in reduced_outputs(ln, red, WK, cfg.threads(), bid, m, n):
                outs.store(mm, col, v)
        assert not ops.inflight.any(), "copies still in flight at the end of the block"
        # every iteration of every warp waited for one completed phase of its stage
        assert sum(st["phase"] for st in ops.bars.values()) == (ln.NIT * WN * WK if cfg.bulk else 0)
    return outs.result(), ops.mma_calls


def reduced_outputs(ln, red, wk_count: int, nthr: int, bid: int, m: int, n: int):
    """The warps_k reduction of block bid as the kernel's epilogue does it (thread i sums slot i
    over the wk_count shares, a pass per nthr outputs): (token rows, columns, values) per pass,
    the outputs past the block's left out."""
    assert not np.isnan(red).any(), "reduction slot never written"
    out = []
    for p in range(-(-ln.out_blk // nthr)):
        idx = np.arange(nthr) + p * nthr
        idc = np.minimum(idx, ln.out_blk - 1)
        s = sum(red[q * ln.out_blk + idc] for q in range(wk_count)).astype(np.float32)
        mm, col = ln.out_coord(bid, idc)
        v = np.broadcast_to(ln.final(s, np.minimum(mm, m - 1), np.minimum(col, n - 1)), idx.shape)
        ok = idx < ln.out_blk
        out.append((mm[ok], col[ok], v[ok]))
    return out


def random_e4m3_bytes(rng: np.random.Generator, shape, full_range: bool = True) -> np.ndarray:
    """Random e4m3 bit patterns without the two NaNs; full_range=False keeps |v| <= 2."""
    if full_range:
        v = rng.integers(0, 256, size=shape)
        v[(v & 0x7F) == 0x7F] = 0x00
    else:
        v = rng.integers(0, 64, size=shape) | (rng.integers(0, 2, size=shape) << 7)  # exponent <= 7
    return v.astype(np.uint8)
