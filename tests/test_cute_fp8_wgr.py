"""The register-weights warpgroup fp8 GEMM (Fp8Config.wgr: 64 weight rows as wgmma's A straight
from global memory into registers, x staged into shared memory in the same K permutation as B):
its emulated program against the fp64 reference over configs and scale kinds, the emulator's
refusals of a missing fence and of a wrong staging order, the config checks, the sweep's
candidates, the PTX / SASS it compiles to, and (marker ``gpu``) the kernel on a GPU."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from executors.cute import fp8, fp8_wgr
from executors.cute.fp8 import Fp8Config
from executors.cute.fp8_config import wgr_registers
from tests.cuteutil import gpu
from tests.fp8cases import KIND_CODES, SHAPES, close, need_cutlass, operands, ref64
from tests.fp8emu_wg import without_fence
from tests.fp8emu_wgr import emulate_wgr


def wgr(**kw) -> Fp8Config:
    return Fp8Config(tiles=1, wgr=True, **kw)


# (config, M, N, K): one and several warpgroups along K, depth below / equal to the K blocks,
# a partial last tile (N % 64), m_tile 8 and 16 at M below it, one K block, the early launch
WGR_CASES = [
    (wgr(m_tile=16, warps_k=2, unroll=2, depth=2), 11, 100, 512),
    (wgr(m_tile=8, warps_k=1, unroll=3, depth=2), 5, 64, 384),
    (wgr(m_tile=16, warps_k=4, unroll=1, depth=1, early=True), 16, 130, 512),
    (wgr(m_tile=8, warps_k=3, unroll=2, depth=2), 8, 72, 768),
    (wgr(m_tile=16, warps_k=1, unroll=5, depth=3), 9, 40, 640),
    (wgr(m_tile=8, warps_k=1, unroll=1, depth=1), 1, 200, 128),
    (wgr(m_tile=16, warps_k=2, unroll=2, depth=2, ks=2), 13, 100, 1024),
    (wgr(m_tile=8, warps_k=1, unroll=1, depth=1, ks=4), 7, 64, 512),
    (wgr(m_tile=16, warps_k=1, unroll=3, depth=2, ks=8, early=True), 16, 70, 3072),
]


@pytest.mark.parametrize("case", range(len(WGR_CASES)))
@pytest.mark.parametrize("kinds", [("block", "block"), ("tensor", "tensor"), ("row", "col"), ("block", "col")])
def test_emulated_wgr_kernel_matches_fp64_reference(case, kinds):
    cfg, m, n, k = WGR_CASES[case]
    ka, kb_ = kinds
    x, w, sa, sb = operands(10 * case + len(ka), m, n, k, ka, kb_)
    out, calls = emulate_wgr(cfg, x, w, sa, sb, KIND_CODES[ka], KIND_CODES[kb_])
    ok, rel = close(out, ref64(x, w, sa, sb, ka, kb_), x, w)
    assert ok, (cfg.key(), kinds, rel)
    assert calls == cfg.grid(n) * cfg.warps_k * cfg.unroll * 4  # one wgmma per k32 step


def test_staged_offset_is_a_bijection_onto_the_descriptors_view():
    """staged_offset puts every byte of a warpgroup's x range in its own place, and the real K
    offset of the word lane t gives a k32 step s as a0 (h = 0) or a2 (h = 1), 64h + 16t + 4s, lands
    where the step's descriptor shows logical K 32s + 16h + 4t of token 0 (the canonical layout:
    core matrix column k // 16 at 128 bytes each, byte k % 16). The emulated tests check the
    fragments against the same layout end to end."""
    sbo = 3 * 1024
    n, kk = np.meshgrid(np.arange(16), np.arange(3 * 128), indexing="ij")
    offs = fp8_wgr.staged_offset(n, kk, sbo)
    assert np.unique(offs).size == offs.size and offs.min() == 0 and offs.max() == 16 * 3 * 128 - 1
    for s in range(4):
        for t in range(4):
            for h in range(2):
                real = 64 * h + 16 * t + 4 * s  # word s (h = 0) or 4 + s (h = 1) of lane t
                logical = 32 * s + 16 * h + 4 * t
                want = (logical // 16) * 128 + logical % 16  # token 0, the descriptor's view
                assert fp8_wgr.staged_offset(0, real, sbo) == want


_NoFence = without_fence(fp8_wgr.WgrProgram)


class _SwappedHalves(fp8_wgr.WgrProgram):
    """Feeds a k32 step's a0 / a1 from the second 64-byte vector and a2 / a3 from the first:
    the fragments no longer meet the staged x's K order."""

    @staticmethod
    def frag(wv, s):
        return [wv[1][s], wv[3][s], wv[0][s], wv[2][s]]


class _OneShare(fp8_wgr.WgrProgram):
    """Every block of a cluster finishes the first block's share."""

    def share_slots(self, rank, tid, nthr):
        return super().share_slots(rank * 0, tid, nthr)


class _ShortPasses(fp8_wgr.WgrProgram):
    """The share's passes rounded down: the outputs of its last, partial pass are never stored."""

    def share_slots(self, rank, tid, nthr):
        return super().share_slots(rank, tid, nthr)[:self.share // nthr]


_ONE = (wgr(m_tile=16, warps_k=1, unroll=2, depth=2), 6, 256)


@pytest.mark.parametrize("program,message,case", [
    (_NoFence, "not landed, fenced", _ONE), (_SwappedHalves, None, _ONE),
    (_OneShare, "outputs written 0..4 times", (wgr(m_tile=16, warps_k=1, unroll=2, depth=2, ks=4), 16, 1024)),
    # share 512 over 384 threads: a second pass, its last 256 threads clamped and not stored (M = 16:
    # every output of the tile is a real one)
    (_ShortPasses, "outputs written 0..1 times", (wgr(m_tile=16, warps_k=3, unroll=2, depth=2, ks=2), 16, 1536)),
])
def test_emulator_catches_wgr_mistakes(program, message, case):
    """Negative controls: the staged x not fenced to the async proxy; fragments out of the
    staging's K order (wrong products); a cluster's blocks all finishing one share, and a share's
    last pass dropped (outputs stored 0 or several times)."""
    (cfg, m, k), n = case, 64
    x, w, sa, sb = operands(5, m, n, k, "block", "block")
    good, _ = emulate_wgr(cfg, x, w, sa, sb, 2, 2)
    assert close(good, ref64(x, w, sa, sb, "block", "block"), x, w)[0]
    if message is None:
        bad, _ = emulate_wgr(cfg, x, w, sa, sb, 2, 2, program=program)
        assert not close(bad, ref64(x, w, sa, sb, "block", "block"), x, w)[0]
    else:
        with pytest.raises(AssertionError, match=message):
            emulate_wgr(cfg, x, w, sa, sb, 2, 2, program=program)


@pytest.mark.parametrize("cfg,k,why", [
    (wgr(warps_k=2, unroll=2, depth=2), 1024, "must be K/128"),
    (wgr(warps_k=1, unroll=4, depth=1), 512, "depth"),
    (wgr(warps_k=1, unroll=4, depth=5), 512, "depth"),
    (Fp8Config(tiles=2, warps_k=1, unroll=4, depth=2, wgr=True), 512, "tiles"),
    (wgr(warps_k=1, unroll=4, depth=2, bulk=2), 512, "not with wg, bulk"),
    (wgr(warps_k=4, unroll=4, depth=4, m_tile=16), 2048, "registers"),
    (wgr(warps_k=8, unroll=1, depth=1, m_tile=16, minb=2), 1024, "minb * threads <= 256"),
    (wgr(warps_k=1, unroll=18, depth=2), 2304, "at most 16"),
    (wgr(warps_k=1, unroll=16, depth=9), 2048, "depth"),
    (wgr(warps_k=1, unroll=2, depth=2, ks=3), 768, "ks"),
    (wgr(warps_k=1, unroll=2, depth=2, ks=2), 512, None),
    (Fp8Config(warps_k=1, ks=2), 512, "needs wgr"),
])
def test_wgr_config_checks(cfg, k, why):
    got = cfg.check(16, 256, k)
    assert got is None if why is None else why in got, got


@pytest.mark.parametrize("name", list(SHAPES))
def test_wgr_sweep_candidates(name):
    n, k = SHAPES[name]
    for m in (8, 16):
        cands = fp8.fp8_wgr_grid(m, n, k)
        assert cands[0] == fp8.default_fp8_config(m, n, k)
        assert len(cands) >= 3 and len(set(cands)) == len(cands)
        assert all(c.wgr and c.check(m, n, k) is None for c in cands[1:])
        assert any(c.early for c in cands) and any(c.minb == 2 for c in cands)


def _largest(name, m):
    """The sweep's candidate with the most estimated registers at this shape and M."""
    n, k = SHAPES[name]
    return max(fp8.fp8_wgr_grid(m, n, k)[1:], key=wgr_registers), n, k


def _moves_of_early_loads(sass: str) -> int:
    """MOVs before griddepcontrol.wait (ACQBULK) that read a register an earlier load wrote: each
    waits there for that load to land."""
    loaded, n = set(), 0
    for ln in sass.splitlines():
        if "ACQBULK" in ln:
            return n
        m = re.search(r"\b(LDG\S*)\s+R(\d+)", ln)
        if m:
            width = 4 if ".128" in m.group(1) else 2 if ".64" in m.group(1) else 1
            loaded |= {int(m.group(2)) + i for i in range(width)}
            continue
        m = re.search(r"\bI?M\w*MOV\S*\s+R\d+,.*?R(\d+)\s*;", ln)
        if m and int(m.group(1)) in loaded:
            n += 1
    return n


@pytest.mark.parametrize("cfg,n,k", [(wgr(m_tile=16, warps_k=4, unroll=4, depth=2), 7168, 2048),
                                     (wgr(m_tile=8, warps_k=2, unroll=9, depth=6, early=True), 7168, 2304),
                                     (wgr(m_tile=8, warps_k=1, unroll=4, depth=2), 4096, 512),
                                     (wgr(m_tile=16, warps_k=2, unroll=7, depth=4, ks=4), 2112, 7168),
                                     _largest("qkvg", 8), _largest("qkv_a", 16), _largest("mlp_down", 16)])
def test_wgr_sass_loads_before_wait_native_wgmma_no_spills(cfg, n, k):
    """Also at the sweep's largest candidates (the register estimate keeps them from spilling);
    the weights' register copies come after the wait, and the shared stores are exactly the
    staging's, the reduction's and the cluster shares'."""
    need_cutlass()
    import executors.cute as ec

    if ec.nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed (dev extra nvidia-cuda-nvdisasm)")
    sass = fp8.compile_fp8_for_arch(cfg, n, k, sass=True)
    assert sass.count(f"QGMMA.64x{cfg.m_tile}x32.F32.E4M3.E4M3") == 4 * cfg.unroll
    assert "STL" not in sass and "LDL" not in sass, cfg.key()
    wait = sass.index("ACQBULK")
    # the first depth K blocks' 4 weight vectors and their block scale, all before the wait
    assert sass.count("LDG", 0, wait) == 5 * cfg.depth
    assert _moves_of_early_loads(sass) == 0, cfg.key()
    ptx = fp8.compile_fp8_for_arch(cfg, n, k)
    staging = 4 * -(-cfg.m_tile * cfg.unroll * 8 // 128)
    red = cfg.m_tile // 2 if cfg.warps_k > 1 or cfg.ks > 1 else 0
    share = -(-64 * cfg.m_tile // cfg.threads()) if cfg.ks > 1 else 0
    assert ptx.count("st.shared.b32") == staging + red + share, cfg.key()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [3, 16])
def test_gpu_wgr_configs(m):
    """Every third wgr candidate (clusters included) against the fp32 reference of the dequantized
    operands, poisoned outputs, bf16 out; and the first with per-row / per-column scales into fp32.
    Its tolerance is the wg kernel's: wgmma accumulates fp8 products in less than fp32 precision
    inside each 128-wide K block (measured above 1e-4 here, so not the lane kernel's 1e-5)."""
    from tests.test_cute_fp8_gpu import _check_call, _check_gpu_configs

    names = ("qkv_a", "o_proj", "kv_b", "mlp_down", "fb")
    _check_gpu_configs(m, names, lambda m, n, k: fp8.fp8_wgr_grid(m, n, k)[1::3], seed=71 + m)
    for name in names:
        n, k = SHAPES[name]
        cfg = fp8.fp8_wgr_grid(m, n, k)[1]
        _check_call(m, n, k, ("row", "col"), 81 + m, torch.float32, f"{name} {cfg.key()} row/col fp32", 6e-3,
                    config=cfg)
