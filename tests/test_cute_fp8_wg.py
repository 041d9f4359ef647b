"""The warpgroup fp8 GEMM (Fp8Config.wg: wgmma on fp8 operands, x from registers and the weights
from shared memory): its emulated
program against the fp64 reference over configs and scale kinds, the emulator's refusals of a
missing fence, an early refill and wrong descriptors, the config checks, the sweep's candidates,
the PTX / SASS it compiles to, and (marker ``gpu``) the kernel on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from executors.cute import fp8, fp8_wg
from executors.cute.fp8 import Fp8Config
from executors.cute.fp8_config import blocks_per_sm
from tests.cuteutil import gpu
from tests.fp8cases import KIND_CODES, SHAPES, close, need_cutlass, operands, ref64
from tests.fp8emu_wg import WgOps, emulate_wg, without_fence


def wg(**kw) -> Fp8Config:
    return Fp8Config(hw=4, wg=True, **kw)


# (config, M, N, K): one and several warpgroups along K, both K orders, unroll 1..4, 8..64
# weight rows per warpgroup, stages below / equal to / above the iterations, clamped last blocks, m_tile 8
# and 16 at M below it, the early launch
WG_CASES = [
    (wg(m_tile=16, tiles=2, warps_k=2, unroll=2, bulk=3), 11, 40, 1024),
    (wg(m_tile=8, tiles=1, warps_k=1, unroll=1, bulk=2), 5, 24, 640),
    (wg(m_tile=8, tiles=8, warps_k=1, unroll=1, bulk=2), 8, 130, 512),
    (wg(m_tile=16, tiles=4, warps_k=1, unroll=1, ki=0, bulk=3), 16, 100, 768),
    (wg(m_tile=16, tiles=2, warps_k=3, unroll=1, ki=0, bulk=2, early=True), 13, 48, 1536),
    (wg(m_tile=8, tiles=8, warps_k=2, unroll=1, bulk=2), 1, 72, 512),
    (wg(m_tile=16, tiles=1, warps_k=1, unroll=4, bulk=2), 9, 16, 1024),
]


@pytest.mark.parametrize("case", range(len(WG_CASES)))
@pytest.mark.parametrize("kinds", [("block", "block"), ("tensor", "tensor"), ("row", "col"), ("row", "block")])
def test_emulated_wg_kernel_matches_fp64_reference(case, kinds):
    cfg, m, n, k = WG_CASES[case]
    ka, kb_ = kinds
    x, w, sa, sb = operands(10 * case + len(ka), m, n, k, ka, kb_)
    out, calls = emulate_wg(cfg, x, w, sa, sb, KIND_CODES[ka], KIND_CODES[kb_])
    ok, rel = close(out, ref64(x, w, sa, sb, ka, kb_), x, w)
    assert ok, (cfg.key(), kinds, rel)
    # one wgmma per 32-wide K step of every warpgroup's K blocks
    assert calls == cfg.grid(n) * cfg.warps_k * cfg.iterations(k) * cfg.unroll * 4


_NoFence = without_fence(fp8_wg.WgProgram)


class _EarlyRefill(fp8_wg.WgProgram):
    def _issue_mma(self, it, xa):  # refills the stage it is about to read from, before waiting
        parts = super()._issue_mma(it, xa)
        if it + self.S < self.NIT:
            self.issue_w(it + self.S)
            self._commit(("w", it + self.S))
        return parts


class _SwappedDesc(fp8_wg.WgProgram):
    def setup_wg(self, ring, wtid, bar_id):
        super().setup_wg(ring, wtid, bar_id)
        self.desc_w0 = self.o.make_desc(self.ring, fp8_wg.desc_bits(self.sbo_w, 128))  # LBO <-> SBO


@pytest.mark.parametrize("program,message", [
    (_NoFence, "not landed, fenced"),
    (_EarlyRefill, "pending wgmma reads"),
    (_SwappedDesc, None),
])
def test_emulator_catches_wg_mistakes(program, message):
    """Negative controls: a missing async-proxy fence, a refill of a stage a wgmma in flight
    reads, and the weights' descriptor with its two offsets exchanged (wrong products, or reads
    of bytes never copied)."""
    cfg, m, n, k = wg(m_tile=16, tiles=2, warps_k=1, unroll=1, bulk=2), 6, 32, 512
    x, w, sa, sb = operands(5, m, n, k, "block", "block")
    good, _ = emulate_wg(cfg, x, w, sa, sb, 2, 2)
    assert close(good, ref64(x, w, sa, sb, "block", "block"), x, w)[0]
    if message is None:
        try:
            bad, _ = emulate_wg(cfg, x, w, sa, sb, 2, 2, program=program)
        except AssertionError as e:  # reads of bytes never copied
            assert "wgmma" in str(e), e
            return
        assert not close(bad, ref64(x, w, sa, sb, "block", "block"), x, w)[0]
    else:
        with pytest.raises(AssertionError, match=message):
            emulate_wg(cfg, x, w, sa, sb, 2, 2, program=program)


def test_wg_descriptor_bits():
    """Start address >> 4 in bits 0..13, leading offset >> 4 in 16..29, stride offset >> 4 in
    32..45, no swizzle (PTX ISA matrix descriptor)."""
    bits = fp8_wg.desc_bits(256, 128)
    assert bits == (16 << 16) | (8 << 32)
    d = int(WgOps.make_desc(np.int64(0x1230), bits))
    assert d & 0x3FFF == 0x123 and (d >> 16) & 0x3FFF == 16 and (d >> 32) & 0x3FFF == 8 and d >> 62 == 0


@pytest.mark.parametrize("field,value,words", [
    ("warps_n", 2, "warps_n is 1"), ("bulk", 0, "bulk (stages) is 2..8"), ("bulk", 1, "bulk (stages) is 2..8"),
    ("tiles", 3, "tiles must be"), ("tiles", 16, "tiles must be"), ("depth", 2, "depth 1"), ("l2pre", 2, "l2pre 0"),
    ("unroll", 4, "registers a thread"), ("warps_k", 8, "registers a thread"),
])
def test_wg_config_errors(field, value, words):
    base = dict(m_tile=16, tiles=8 if field == "unroll" else 2, warps_k=1, unroll=1, bulk=2)
    base[field] = value
    why = wg(**base).check(16, 1024, 2048)
    assert why is not None and words in why, why


def test_wg_config_bad_fields_are_errors_not_crashes():
    for bad in (dict(warps_k=0), dict(warps_k=-1), dict(unroll=0), dict(tiles=0)):
        why = wg(**{"m_tile": 16, "tiles": 2, "unroll": 1, "bulk": 2, "warps_k": 1, **bad}).check(16, 1024, 2048)
        assert why is not None and "wg:" not in why, (bad, why)


class _OverlappingRings(fp8_wg.WgProgram):
    def setup_wg(self, ring, wtid, bar_id):  # every warpgroup on warpgroup 0's ring
        wk, self.wk = self.wk, 0
        super().setup_wg(ring, wtid, bar_id)
        self.wk = wk


def test_emulator_catches_overlapping_warpgroup_rings():
    cfg, m, n, k = wg(m_tile=8, tiles=1, warps_k=2, unroll=1, bulk=2), 3, 16, 512
    x, w, sa, sb = operands(9, m, n, k, "block", "block")
    with pytest.raises(AssertionError, match="overlaps"):
        emulate_wg(cfg, x, w, sa, sb, 2, 2, program=_OverlappingRings)


def test_wg_shared_memory_and_threads():
    """A warpgroup per warps_k with its ring (S stages of 8 * tiles rows x unroll K blocks), and
    a second reduction half."""
    c = wg(m_tile=16, tiles=2, warps_k=2, unroll=2, bulk=3)
    assert c.threads() == 256
    stage = 16 * 2 * 128 + 16 * (2 * 128 + 16)  # weights, then 16 x rows of 2 K blocks + 16
    assert c.wg_stage_bytes() == stage
    assert c.smem_bytes() == 2 * 3 * stage + 2 * 4 * 2 * 2 * 16 * 8


def test_wg_grid_candidates():
    for m, (n, k) in ((8, SHAPES["qkv_a"]), (16, SHAPES["o_proj"]), (16, SHAPES["qkvg"])):
        grid = fp8.fp8_wg_grid(m, n, k)
        assert grid[0] == fp8.default_fp8_config(m, n, k) and len(grid) > 10
        for c in grid[1:]:
            assert c.wg and c.check(m, n, k) is None and c.bulk <= c.iterations(k)
            per = blocks_per_sm(c)
            assert c.grid(n) <= fp8.SMS * per, c.key()


def test_ptx_of_wg_kernel():
    """What the trace emits: one wgmma m64nNk32 e4m3 (A from registers) per K step of every
    iteration, the first S stages' weight copies before griddepcontrol.wait and every x copy
    after it, A's 4-byte shared loads (4 per step at m_tile 16), no mma.sync, no conversion; the
    SASS has the native fp8 QGMMA and nothing spilled."""
    need_cutlass()
    cfg, n, k = wg(m_tile=16, tiles=2, warps_k=2, unroll=2, bulk=3), 2112, 7168
    ptx = fp8.compile_fp8_for_arch(cfg, n, k)
    nit = cfg.iterations(k)
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3") == nit * 2 * 4
    wait = ptx.index("griddepcontrol.wait")
    pieces = 16 * 2 * 8 // 128  # 16-byte weight pieces per thread and stage
    assert ptx.count("cp.async.cg.shared.global", 0, wait) == 3 * pieces
    assert ptx.count("cp.async.cg.shared.global") == nit * pieces + nit * 16 * 2 * 8 // 128
    # A fragments, plus the warps_k reduction's reads of the other warpgroup's sums
    assert ptx.count("ld.shared.b32") == nit * 2 * 4 * 4 + cfg.warps_k
    assert "mma.sync" not in ptx and "cvt.rn.f16x2.e4m3x2" not in ptx and ".local" not in ptx
    sass = fp8.compile_fp8_for_arch(cfg, n, k, sass=True)
    assert sass.count("QGMMA.64x16x32.F32.E4M3.E4M3") == nit * 2 * 4
    assert "STL" not in sass and "LDL" not in sass


# ---- on a GPU ---------------------------------------------------------------------------
@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [3, 16])
def test_gpu_wg_configs(m):
    """A sample of fp8_wg_grid against the fp32 reference, poisoned outputs, at three shapes."""
    from tests.test_cute_fp8_gpu import _check_call, _check_gpu_configs

    names = ("qkv_a", "o_proj", "qkvg")
    _check_gpu_configs(m, names, lambda m, n, k: fp8.fp8_wg_grid(m, n, k)[1::6], seed=51 + m)
    for name in names:  # per-row / per-column scales, fp32 out
        n, k = SHAPES[name]
        cfg = fp8.fp8_wg_grid(m, n, k)[1]
        _check_call(m, n, k, ("row", "col"), 61 + m, torch.float32,
                            f"{name} {cfg.key()} row/col fp32", 6e-3, config=cfg)
