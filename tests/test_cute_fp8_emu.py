"""The fp8 kernel's lane program run by the emulator (tests/fp8emu.py) against an fp64 reference
for many configs, shapes and scale layouts, the bulk-copy ring's and the L2 prefetch's rules, and
the negative controls that show the checks catch a wrong K permutation, ring mistakes and
prefetches outside their range."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import executors.cute as ec
from executors.cute import fp8
from executors.cute.fp8 import Fp8Config
from executors.cute.fp8_lane import acc_entries, k_block
from tests.fp8cases import KIND_CODES, SHAPES, close, need_cutlass, ref64, scales
from tests.fp8emu import NumpyOps, emulate, random_e4m3_bytes

# --------------------------------------------------------------------------------------
# the kernel's lane program, emulated on the CPU
# --------------------------------------------------------------------------------------
EMU_CASES = [  # (config, M, N, K)
    (Fp8Config(m_tile=8, tiles=2, warps_k=3), 5, 200, 384),
    (Fp8Config(m_tile=8, tiles=1, warps_k=1, unroll=2, hw=4, ki=0), 8, 40, 256),
    (Fp8Config(m_tile=16, tiles=1, warps_k=1, unroll=3, hw=0), 16, 72, 384),
    (Fp8Config(m_tile=16, tiles=4, warps_n=2, warps_k=2, hw=1, ki=0), 9, 200, 512),
    (Fp8Config(m_tile=16, tiles=2, warps_k=2, unroll=2, hw=3, minb=2), 13, 131, 512),
    (Fp8Config(m_tile=8, tiles=4, warps_k=4, hw=2), 1, 20, 512),
    (Fp8Config(m_tile=8, tiles=2, warps_k=1, hw=4, depth=3), 7, 48, 640),     # 5 iterations, 3 in flight
    (Fp8Config(m_tile=16, tiles=1, warps_k=2, unroll=2, depth=2), 12, 24, 512),  # depth = iterations
    (Fp8Config(m_tile=8, tiles=1, warps_k=1, depth=4), 3, 16, 256),           # depth > iterations
    # the bulk-copy ring: stages < iterations, > iterations, = iterations (all held before the
    # wait), one stage (serial), a K split with interleaved and contiguous K orders, two warps
    # along N, a clamped last tile
    (Fp8Config(m_tile=16, tiles=2, warps_k=2, unroll=1, hw=4, bulk=3), 10, 40, 768),
    (Fp8Config(m_tile=8, tiles=1, warps_k=1, unroll=2, hw=4, ki=0, bulk=1), 5, 24, 768),
    (Fp8Config(m_tile=8, tiles=2, warps_k=1, hw=4, bulk=2), 6, 40, 640),
    (Fp8Config(m_tile=16, tiles=1, warps_k=2, unroll=2, hw=2, bulk=3), 14, 24, 1024),
    (Fp8Config(m_tile=16, tiles=4, warps_k=2, unroll=1, hw=4, ki=0, bulk=4), 11, 100, 768),
    (Fp8Config(m_tile=8, tiles=2, warps_n=2, warps_k=1, unroll=2, hw=4, bulk=3), 2, 72, 512),
    # activations (and scales) loaded 2-4 iterations ahead, registers and ring, > and = iterations
    (Fp8Config(m_tile=16, tiles=2, warps_k=1, hw=4, depth=2, xahead=3), 15, 32, 768),
    (Fp8Config(m_tile=8, tiles=1, warps_k=2, unroll=2, hw=2, xahead=4), 4, 24, 1024),
    (Fp8Config(m_tile=16, tiles=2, warps_k=1, unroll=1, hw=4, bulk=3, xahead=2), 9, 40, 640),
    (Fp8Config(m_tile=8, tiles=1, warps_k=2, unroll=1, hw=4, bulk=2, xahead=3), 6, 16, 768),
    (Fp8Config(m_tile=16, tiles=1, warps_k=1, unroll=4, hw=4, bulk=2), 7, 24, 1024),  # 512-byte copies
]
# the L2 prefetch before the PDL wait (l2pre): registers and ring, K orders 0 / 1, two warps
# along N, clamped last tiles, all iterations or some
PRE_CASES = [  # (config, M, N, K)
    (Fp8Config(m_tile=8, tiles=2, warps_k=2, hw=4, l2pre=3), 5, 200, 768),
    (Fp8Config(m_tile=16, tiles=1, warps_k=2, unroll=2, ki=0, depth=2, l2pre=4), 12, 24, 2048),
    (Fp8Config(m_tile=16, tiles=4, warps_n=2, warps_k=1, hw=4, bulk=2, l2pre=4), 9, 100, 512),
    (Fp8Config(m_tile=8, tiles=2, warps_k=2, ki=0, hw=2, bulk=2, xahead=2, l2pre=3), 3, 40, 768),
    (Fp8Config(m_tile=8, tiles=1, warps_k=3, unroll=2, hw=4, depth=2, l2pre=3), 8, 16, 2304),
]
EMU_CASES += PRE_CASES


@pytest.mark.parametrize("case", range(len(EMU_CASES)))
@pytest.mark.parametrize("kinds", [("block", "block"), ("tensor", "tensor"), ("row", "col"),
                                   ("block", "col"), ("tensor", "block"), ("row", "block")])
def test_emulated_kernel_matches_fp64_reference(case, kinds):
    cfg, m, n, k = EMU_CASES[case]
    ka, kb_ = kinds
    rng = np.random.default_rng(10 * case + len(ka) + 3 * len(kb_))
    x = random_e4m3_bytes(rng, (m, k))
    w = random_e4m3_bytes(rng, (n, k))
    sa, sb = scales(rng, ka, m, k, "a"), scales(rng, kb_, n, k, "b")
    out, calls = emulate(cfg, x, w, sa, sb, KIND_CODES[ka], KIND_CODES[kb_])
    ok, rel = close(out, ref64(x, w, sa, sb, ka, kb_), x, w)
    assert ok, (cfg.key(), kinds, rel)
    per_block = 8 * cfg.tiles  # 2 K steps x 4 words
    assert calls == cfg.grid(n) * cfg.warps_n * cfg.warps_k * cfg.iterations(k) * cfg.unroll * per_block


def test_emulated_strided_operands():
    """x with a padded row stride, column-major activation scales (DeepGEMM's layout) and
    transposed-storage weight scales read through their strides."""
    cfg = Fp8Config(m_tile=16, tiles=2, warps_k=2)
    m, n, k = 11, 264, 512
    rng = np.random.default_rng(7)
    x, w = random_e4m3_bytes(rng, (m, k)), random_e4m3_bytes(rng, (n, k))
    sa, sb = scales(rng, "block", m, k, "a"), scales(rng, "block", n, k, "b")
    out, _ = emulate(cfg, x, w, sa, sb, 2, 2, x_stride=k + 48, sa_strides=(1, m),
                     sb_strides=(1, sb.shape[0]))
    ok, rel = close(out, ref64(x, w, sa, sb, "block", "block"), x, w)
    assert ok, rel


def test_emulator_catches_mismatched_k_permutation():
    """Negative control: if the weights' hardware conversion put its bytes in another order than
    x's, the products pair the wrong K positions and the comparison fails."""
    cfg = Fp8Config(m_tile=8, tiles=1, warps_k=1, hw=4)
    m, n, k = 4, 16, 128
    rng = np.random.default_rng(3)
    x, w = random_e4m3_bytes(rng, (m, k)), random_e4m3_bytes(rng, (n, k))
    sa, sb = np.ones((1, 1), np.float32), np.ones((1, 1), np.float32)
    ref = ref64(x, w, sa, sb, "tensor", "tensor")
    out, _ = emulate(cfg, x, w, sa, sb, 0, 0)
    assert close(out, ref, x, w)[0]
    orig = NumpyOps.mma

    def mma_with_swapped_b(self, a, b, c):  # b halves exchanged: the weights in another K order
        return orig(self, a, [((v >> 16) | (v << 16)) & 0xFFFFFFFF for v in b], c)

    NumpyOps.mma = mma_with_swapped_b
    try:
        bad, _ = emulate(cfg, x, w, sa, sb, 0, 0)
    finally:
        NumpyOps.mma = orig
    assert not close(bad, ref, x, w)[0]


@pytest.mark.parametrize("bug", ["parity", "ahead", "early", "no_sync", "no_fence", "no_arm", "overlap"])
def test_emulator_catches_bulk_ring_mistakes(bug, monkeypatch):
    """Negative controls of the emulated ring: waiting on the other phase parity reads bytes
    still in flight; refilling a stage one iteration early re-arms a phase still pending;
    refilling it right after its wait copies over landed bytes nobody read; without the warp
    sync a copy may overwrite what other lanes just read; a barrier used before the init
    fence; a stage whose byte count is never armed never completes; two warps' rings that
    overlap."""
    from executors.cute import fp8_lane

    cfg, m, n, k = Fp8Config(m_tile=8, tiles=2, warps_k=2, hw=4, bulk=2), 4, 16, 1280
    rng = np.random.default_rng(5)
    x, w = random_e4m3_bytes(rng, (m, k)), random_e4m3_bytes(rng, (n, k))
    sa, sb = np.ones((1, 1), np.float32), np.ones((1, 1), np.float32)
    out, _ = emulate(cfg, x, w, sa, sb, 0, 0)
    assert close(out, ref64(x, w, sa, sb, "tensor", "tensor"), x, w)[0]
    lp = fp8_lane.LaneProgram
    if bug == "parity":
        monkeypatch.setattr(lp, "bulk_wait", lambda self, it: self.o.mbar_wait(
            self.bars + self.o.Int32((it % self.S) * 8), 1 - (it // self.S) % 2))
    elif bug == "ahead":
        orig = lp.bulk_issue
        monkeypatch.setattr(lp, "bulk_issue", lambda self, it: orig(self, it + 1) if it >= 1 else orig(self, it))
    elif bug == "early":
        wait, issue = lp.bulk_wait, lp.bulk_issue
        monkeypatch.setattr(lp, "bulk_wait", lambda self, it: (wait(self, it), issue(self, it + self.S)))
    elif bug == "no_sync":
        monkeypatch.setattr(NumpyOps, "sync_warp", lambda self: None)
    elif bug == "no_fence":
        monkeypatch.setattr(NumpyOps, "mbar_init_fence", lambda self: None)
    elif bug == "overlap":
        orig = lp.setup_bulk
        monkeypatch.setattr(lp, "setup_bulk", lambda self, ring, bars, warp, *a: orig(self, ring, bars, warp * 0, *a))
    else:
        monkeypatch.setattr(NumpyOps, "expect_tx", lambda self, bar, nbytes, idx, limit: None)
    why = {"parity": "in flight", "ahead": "armed twice", "early": "copy over landed bytes nobody read",
           "no_sync": "read since the last warp sync", "no_fence": "before the init fence",
           "no_arm": "armed False", "overlap": "overlaps another warp"}
    with pytest.raises(AssertionError, match=why[bug]):
        emulate(cfg, x, w, sa, sb, 0, 0)


def _expected_prefetch(cfg, n, k):
    """(block, weight row, K block) of iterations [loaded_first, l2pre) of every warp's rows."""
    nit, first, r = cfg.iterations(k), cfg.loaded_first(k), cfg.tiles
    want = []
    for bid in range(cfg.grid(n)):
        for warp in range(cfg.warps_n * cfg.warps_k):
            wn, wk = warp % cfg.warps_n, warp // cfg.warps_n
            n_tile0 = (bid * cfg.warps_n + wn) * 8 * r
            want += [(bid, min(n_tile0 + lane, n - 1), k_block(it, u, wk, cfg.warps_k, cfg.unroll, nit, cfg.ki))
                     for lane in range(8 * r) for it in range(first, cfg.l2pre) for u in range(cfg.unroll)]
    return sorted(want)


@pytest.mark.parametrize("case", range(len(PRE_CASES)))
def test_l2_prefetch_covers_the_iterations_before_l2pre(case):
    """Before the PDL wait each block prefetches exactly the weights of its iterations past
    those it loads then, up to l2pre: every such (row, K block) once (clamped rows repeat)."""
    cfg, m, n, k = PRE_CASES[case]
    rng = np.random.default_rng(case)
    x, w = random_e4m3_bytes(rng, (m, k)), random_e4m3_bytes(rng, (n, k))
    sa, sb = np.ones((1, 1), np.float32), np.ones((1, 1), np.float32)
    got = []
    emulate(cfg, x, w, sa, sb, 0, 0, prefetched=got)
    assert sorted(got) == _expected_prefetch(cfg, n, k), cfg.key()
    assert got  # something was prefetched


@pytest.mark.parametrize("bug", ["order", "past_row", "after_wait"])
def test_emulator_catches_l2_prefetch_mistakes(bug, monkeypatch):
    """Negative controls: ki 1 prefetched with ki 0's ranges covers other K blocks; a range one
    K block too long runs past the weight row; a prefetch after the PDL wait is refused."""
    from executors.cute import fp8_lane

    cfg, m, n, k = Fp8Config(m_tile=8, tiles=2, warps_k=2, hw=4, l2pre=3), 4, 16, 768
    rng = np.random.default_rng(9)
    x, w = random_e4m3_bytes(rng, (m, k)), random_e4m3_bytes(rng, (n, k))
    sa, sb = np.ones((1, 1), np.float32), np.ones((1, 1), np.float32)
    lp = fp8_lane.LaneProgram
    if bug == "order":
        monkeypatch.setattr(lp, "l2_range", lambda self: ((self.wk * self.NIT + self.first) * self.U,
                                                          (self.P - self.first) * self.U))
    elif bug == "past_row":
        orig = lp.l2_range
        monkeypatch.setattr(lp, "l2_range", lambda self: (orig(self)[0] + 1, orig(self)[1] + 1))
    else:
        orig_acts = lp.setup_acts

        def acts_then_prefetch(self, *a):
            orig_acts(self, *a)
            self.l2_prefetch()
        monkeypatch.setattr(lp, "setup_acts", acts_then_prefetch)
    got = []
    if bug == "order":
        emulate(cfg, x, w, sa, sb, 0, 0, prefetched=got)
        assert sorted(got) != _expected_prefetch(cfg, n, k)
    else:
        with pytest.raises(AssertionError, match={"past_row": "past the end of a weight row",
                                                  "after_wait": "after the PDL wait"}[bug]):
            emulate(cfg, x, w, sa, sb, 0, 0)


def test_pre_grid_prefetches_and_leaves_room():
    """fp8_pre_grid: each base candidate as is and with l2pre (all iterations, half of the rest);
    its launch bounds double the resident blocks per SM and keep >= 80 registers per thread."""
    from executors.cute.fp8_config import blocks_per_sm

    for m, (n, k) in ((8, SHAPES["qkv_a"]), (16, SHAPES["mlp_gate_up"]), (8, SHAPES["o_proj"])):
        grid = fp8.fp8_pre_grid(m, n, k)
        assert grid[0] == fp8.default_fp8_config(m, n, k)
        pre = [c for c in grid if c.l2pre]
        assert len(pre) >= 5 and all(c.check(m, n, k) is None for c in grid)
        assert any(c.l2pre == c.iterations(k) for c in pre)
        assert any(c.l2pre < c.iterations(k) for c in pre)
        bases = fp8.fp8_configs_for(m, n, k)
        for c in pre:
            if not any(dataclasses.replace(b, l2pre=c.l2pre, early=c.early) == c for b in bases):
                # a launch bound of its own
                assert 65536 // (c.minb * c.threads()) >= 80 and blocks_per_sm(c) >= c.minb, c.key()
                assert c.minb == 2 * min(blocks_per_sm(c), -(-c.grid(n) // fp8.SMS)), c.key()
    c = Fp8Config(m_tile=8, tiles=2, warps_k=2, depth=2)
    assert "l2pre" in dataclasses.replace(c, l2pre=2).check(8, 256, 1024)  # not past depth
    assert "l2pre" in dataclasses.replace(c, l2pre=5).check(8, 256, 1024)  # past the 4 iterations
    assert dataclasses.replace(c, l2pre=4).check(8, 256, 1024) is None
    assert dataclasses.replace(c, l2pre=4).key().endswith("_d2_p4_pdl1")
    assert dataclasses.replace(c, l2pre=4, early=True).key().endswith("_d2_p4_e_pdl1")
    assert dataclasses.replace(c, early=True, pdl=False).check(8, 256, 1024) is None  # no effect then
    pre = fp8.fp8_pre_grid(8, *SHAPES["qkv_a"])
    assert any(c.early and not c.l2pre for c in pre) and any(c.early and c.l2pre for c in pre)
    assert any(not c.early and c.l2pre for c in pre)


def test_sweep_neighbours_keep_a_fitted_prefetch():
    """A table row with an L2 prefetch (o_proj, down at M <= 8) does not empty the sweeps
    around it: neighbours with other iteration counts prefetch all of theirs (the row prefetched
    all) or none, and the rings and grids keep their size."""
    for name in ("o_proj", "mlp_down"):
        n, k = SHAPES[name]
        base = fp8.default_fp8_config(8, n, k)
        assert base.l2pre, name  # the premise: the shipped row prefetches
        for grid in (fp8.fp8_bulk_grid, fp8.fp8_config_grid, fp8.fp8_configs_for):
            got = grid(8, n, k)
            assert grid is fp8.fp8_configs_for or len(got) >= 5, (name, grid.__name__, len(got))
            for c in got[1:]:
                assert c.check(8, n, k) is None
                if base.l2pre == base.iterations(k) and c.iterations(k) > c.loaded_first(k):
                    assert c.l2pre == c.iterations(k), (name, c.key())
        assert len(fp8.fp8_configs_for(8, n, k)) >= 6, name


def test_ptx_l2_prefetch_before_the_wait():
    """One bulk L2 prefetch per warp, before griddepcontrol.wait; the rest of the kernel as
    without it (the same loads and mma)."""
    need_cutlass()
    n, k = SHAPES["qkv_a"]
    for cfg in (Fp8Config(m_tile=8, tiles=2, warps_k=7, unroll=2, hw=4, l2pre=4),
                Fp8Config(m_tile=16, tiles=2, warps_k=4, unroll=2, ki=0, hw=4, bulk=3, l2pre=7)):
        ptx = fp8.compile_fp8_for_arch(cfg, n, k)
        base = fp8.compile_fp8_for_arch(dataclasses.replace(cfg, l2pre=0), n, k)
        wait = ptx.index("griddepcontrol.wait")
        assert ptx.count("cp.async.bulk.prefetch.L2.global") == 1 == ptx.count("cp.async.bulk.prefetch.L2.global", 0, wait)
        assert "cp.async.bulk.prefetch" not in base
        for op in ("ld.global.nc.L1::no_allocate", "mma.sync", "cp.async.bulk.shared::cluster", "ld.shared.v4"):
            assert ptx.count(op) == base.count(op), (cfg.key(), op)
        assert ".local" not in ptx


def test_acc_entries_match_the_bf16_kernels():
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    from executors.cute.kernels import _acc_entries

    for r, mt in ((1, 8), (2, 16), (4, 16)):
        for lane in range(32):
            g, t = divmod(lane, 4)
            theirs = [(ai, ci, m, c8) for ai, ci, _r, m, c8 in _acc_entries(r, mt, 0, g, t)]
            assert acc_entries(r, mt, g, t) == theirs
