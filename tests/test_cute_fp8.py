"""Tests for the CuTe DSL fp8 skinny GEMM (executors.cute.fp8).

CPU, pure: the integer e4m3 -> f16 conversion against torch for every byte, the scale-kind
inference, the per-K-block scaling order against dequantize-then-matmul, the configs, the K
schedule, and the kernel's lane program run by the emulator (tests/fp8emu.py) against an fp64
reference for many configs, shapes and scale layouts (with negative controls showing the checks
catch a wrong K permutation or a wrong scale index).
CPU, cutlass: every default config of the DeepSeek-V3 / KDA shapes compiles for sm_90a; PTX and
SASS show the 16-byte non-coherent weight loads ahead of griddepcontrol.wait, the f16 mma, both
conversions, no spills.
GPU (marker ``gpu``): M = 1..16 on several shapes and all scale kinds against an fp32 reference
of the dequantized operands, poisoned outputs, strided views, fp32 output, graph replay.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import executors.cute as ec
from executors.cute import fp8
from executors.cute.fp8 import BLOCK, Fp8Config
from executors.cute.fp8_lane import acc_entries, k_block
from tests.cuteutil import gpu
from tests.fp8emu import E4M3_F16, NumpyOps, emulate, f16_halves, random_e4m3_bytes

# DeepSeek-V3 TP8 decode shapes (N, K) and the KDA shapes with fp8 weights
DSV3 = {"qkv_a": (2112, 7168), "q_b": (3072, 1536), "kv_b": (4096, 512), "o_proj": (7168, 2048),
        "mlp_gate_up": (4608, 7168), "mlp_down": (7168, 2304), "shared_gate_up": (512, 7168),
        "shared_down": (7168, 256)}
KDA = {"qkvg": (6144, 7168), "fa_beta": (144, 7168), "fb": (1536, 128)}
SHAPES = {**DSV3, **KDA}
KIND_CODES = {"tensor": 0, "row": 1, "col": 1, "block": 2}


def _e4m3_values() -> np.ndarray:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double().numpy()


E4M3 = _e4m3_values()


def _scales(rng, kind: str, rows: int, k: int, operand: str) -> np.ndarray:
    kb = -(-k // BLOCK)
    shape = {"tensor": (1, 1), "row": (rows, 1), "col": (rows, 1),
             "block": (rows, kb) if operand == "a" else (-(-rows // BLOCK), kb)}[kind]
    return rng.uniform(0.25, 4.0, size=shape).astype(np.float32)


def _ref64(x_u8, w_u8, sa, sb, ka, kb_):
    """fp64 (x * sa) @ (w * sb)^T through fp8.dequant_reference's scale expansion."""
    xt = torch.from_numpy(x_u8).view(torch.float8_e4m3fn)
    wt = torch.from_numpy(w_u8).view(torch.float8_e4m3fn)
    m, k = x_u8.shape
    n = w_u8.shape[0]
    fa = fp8._expand_scale(torch.from_numpy(sa).double(), ka, m, k, "a")
    fb = fp8._expand_scale(torch.from_numpy(sb).double(), kb_, n, k, "b")
    return ((xt.double() * fa) @ (wt.double() * fb).t()).numpy()


def _close(out, ref, x_u8, w_u8, tol=2e-6):
    """|out - ref| within tol of the magnitude sum (fp32 accumulation of fp8 products)."""
    mag = np.abs(E4M3[x_u8]) @ np.abs(E4M3[w_u8]).T
    scale = np.abs(ref).max() / max(np.abs(E4M3[x_u8] @ E4M3[w_u8].T).max(), 1e-30)
    bound = tol * (mag * max(scale, 1e-30) + np.abs(ref)) + 1e-30
    bad = np.abs(out - ref) > bound
    return not bad.any(), float((np.abs(out - ref) / (np.abs(ref).max() + 1e-30)).max())


# --------------------------------------------------------------------------------------
# conversions and the scaling math (pure)
# --------------------------------------------------------------------------------------
def test_bits_conversion_exact_for_every_byte():
    """BITS_PROGRAM (the kernel's integer conversion) gives 2^-8 times the exact e4m3 value for
    all 254 finite bytes in every position of a word, whatever the other bytes hold."""
    rng = np.random.default_rng(0)
    finite = np.array([b for b in range(256) if (b & 0x7F) != 0x7F])
    for pos in range(4):
        other = rng.integers(0, 256, size=(finite.size, 4))
        other[:, pos] = finite
        q = (other[:, 0] | (other[:, 1] << 8) | (other[:, 2] << 16) | (other[:, 3] << 24)).astype(np.int64)
        words = fp8.bits_words(q)
        order = fp8.word_byte_order("bits")  # order[reg][half] = byte position
        reg, half = next((r, h) for r in range(2) for h in range(2) if order[r][h] == pos)
        vals = f16_halves(words[reg])[half]
        assert np.array_equal(vals, E4M3[finite] / 256.0), pos
    # the hardware path's table and the byte order the kernel relies on (none: both operands
    # use one method per word), checked against torch
    assert np.array_equal(f16_halves(E4M3_F16)[0], E4M3[np.arange(256)] * 1.0, equal_nan=True)
    d = NumpyOps.cvt_hw(np.array([0x38B0C840]))
    assert f16_halves(d[0])[0][0] == E4M3[0x40] and f16_halves(d[1])[1][0] == E4M3[0x38]


def test_bits_ptx_renders_the_program():
    text = fp8.bits_ptx()
    assert text.count("\n") == len(fp8.BITS_PROGRAM) + 2
    for op, _dst, _src, imm in fp8.BITS_PROGRAM:
        arg = r"\w+" if isinstance(imm, str) else (hex(imm) if imm > 31 else str(imm))
        assert re.search(rf"{op}\.b32 \S+, \S+, {arg};", text), (op, imm)


def test_scale_kind_inference_and_errors():
    assert fp8.scale_kind((), 4, 256, "a") == "tensor"
    assert fp8.scale_kind((1,), 4, 256, "a") == "tensor"
    assert fp8.scale_kind((4, 1), 4, 256, "a") == "row"
    assert fp8.scale_kind((4,), 4, 256, "a") == "row"
    assert fp8.scale_kind((4, 2), 4, 256, "a") == "block"
    assert fp8.scale_kind((200, 1), 200, 256, "b") == "col"
    assert fp8.scale_kind((2, 2), 200, 256, "b") == "block"
    assert fp8.scale_kind((1, 1), 1, 128, "a") == "tensor"  # M = 1, K = 128: every kind is one value
    with pytest.raises(ValueError, match=r"\[4, 2\] \(1x128 blocks\)"):
        fp8.scale_kind((4, 3), 4, 256, "a")
    with pytest.raises(ValueError, match=r"\[2, 2\] \(128x128 blocks\)"):
        fp8.scale_kind((200, 2), 200, 256, "b")


@pytest.mark.parametrize("ka", ["tensor", "row", "block"])
@pytest.mark.parametrize("kb_", ["tensor", "col", "block"])
def test_blockwise_order_equals_dequantize_then_matmul(ka, kb_):
    """Summing raw products per 128-wide K block, scaling each block partial by sa * sb and
    applying tensor / row / column factors last (the kernel's order) equals the plain
    definition; a scale_b indexed by the wrong block coordinate does not (the check can fail)."""
    rng = np.random.default_rng(1)
    m, n, k = 5, 300, 640  # N crosses two 128-row blocks and ends in a partial one
    x = torch.from_numpy(random_e4m3_bytes(rng, (m, k))).view(torch.float8_e4m3fn)
    w = torch.from_numpy(random_e4m3_bytes(rng, (n, k))).view(torch.float8_e4m3fn)
    sa = torch.from_numpy(_scales(rng, ka, m, k, "a"))
    sb = torch.from_numpy(_scales(rng, kb_, n, k, "b"))
    ref = _ref64(x.view(torch.uint8).numpy(), w.view(torch.uint8).numpy(), sa.numpy(), sb.numpy(),
                 ka, kb_)
    got = fp8.blockwise_reference(x, w, sa, sb).double().numpy()
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel < 1e-5, rel
    assert np.abs(fp8.dequant_reference(x, w, sa, sb).double().numpy() - ref).max() / np.abs(ref).max() < 1e-5
    if kb_ == "block":
        wrong = sb.flip(0).contiguous()  # 128-row blocks swapped
        bad = fp8.blockwise_reference(x, w, sa, wrong).double().numpy()
        assert np.abs(bad - ref).max() / np.abs(ref).max() > 1e-2


# --------------------------------------------------------------------------------------
# configs, schedule, capability
# --------------------------------------------------------------------------------------
def test_default_configs_for_every_shape_and_m():
    for name, (n, k) in SHAPES.items():
        for m in range(1, 17):
            cfg = fp8.default_fp8_config(m, n, k)
            assert cfg.check(m, n, k) is None, (name, m, cfg.key())
            assert cfg.m_tile == (8 if m <= 8 else 16)
            assert Fp8Config.from_dict(cfg.to_dict()) == cfg
            cands = fp8.fp8_configs_for(m, n, k)
            assert cands[0] == cfg and len(set(cands)) == len(cands)
            assert all(c.check(m, n, k) is None for c in cands)
    assert Fp8Config(depth=2).key().endswith("_d2_pdl1") and "_d" not in Fp8Config().key()
    assert "depth" in Fp8Config(depth=5).check(8, 64, 512)
    with pytest.raises(ValueError, match="unknown Fp8Config fields"):
        Fp8Config.from_dict({"m_tile": 8, "tile": 2})


def test_config_check_reasons():
    c = Fp8Config(m_tile=8, tiles=2, warps_k=4)
    assert "outside 1..m_tile" in c.check(9, 512, 512)
    assert "multiple of 128" in c.check(4, 512, 200)
    assert "divisible" in c.check(4, 512, 384)
    assert "tiles" in Fp8Config(tiles=3).check(4, 512, 512)
    assert "1024" in Fp8Config(warps_k=33).check(4, 512, 128 * 33)


@pytest.mark.parametrize("wk,u,ki", [(1, 1, 1), (4, 1, 1), (4, 1, 0), (2, 3, 1), (2, 3, 0), (7, 2, 1)])
def test_k_schedule_covers_every_block_once(wk, u, ki):
    kb = wk * u * 3
    nit = kb // (wk * u)
    seen = sorted(k_block(it, uu, w, wk, u, nit, ki) for w in range(wk) for it in range(nit) for uu in range(u))
    assert seen == list(range(kb))


def test_supports_fp8_reasons():
    assert fp8.supports_fp8(16, 2112, 7168, "block", "block") is None
    assert fp8.supports_fp8(1, 144, 7168, "tensor", "col") is None
    assert fp8.supports_fp8(8, 1536, 128, "row", "row") is None  # "row" for b = per weight row
    assert "outside 1..16" in fp8.supports_fp8(17, 2112, 7168, "block", "block")
    assert "multiple of 128" in fp8.supports_fp8(4, 2112, 7000, "block", "block")
    assert "scale_a kind 'blk'" in fp8.supports_fp8(4, 2112, 7168, "blk", "block")
    assert "scale_b kind" in fp8.supports_fp8(4, 2112, 7168, "block", "1x128")
    assert "not a CUDA device" in fp8.supports_fp8(4, 2112, 7168, "block", "block", "cpu")


def test_gemm_fp8_rejects_bad_input_with_reasons():
    x = torch.zeros(4, 256, dtype=torch.float8_e4m3fn)
    w = torch.zeros(64, 256, dtype=torch.float8_e4m3fn)
    s1 = torch.ones(())
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8.gemm_fp8(x.float(), w, s1, s1)
    with pytest.raises(ValueError, match="K mismatch"):
        fp8.gemm_fp8(x, w[:, :128], s1, s1)
    with pytest.raises(ValueError, match="scale_a shape"):
        fp8.gemm_fp8(x, w, torch.ones(4, 3), s1)
    with pytest.raises(ValueError, match="float32"):
        fp8.gemm_fp8(x, w, s1.double(), s1)
    with pytest.raises(ValueError, match="out_dtype"):
        fp8.gemm_fp8(x, w, s1, s1, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="outside 1..16"):
        fp8.gemm_fp8(torch.zeros(17, 256, dtype=torch.float8_e4m3fn), w, s1, s1)
    with pytest.raises(ValueError, match="CUDA tensors"):
        fp8.gemm_fp8(x, w, s1, s1)
    tl_cfg = dataclasses.replace(fp8.default_fp8_config(4, 64, 256), timeline=True)
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        fp8.gemm_fp8(x, w, s1, s1, timeline=[0] * 64)
    with pytest.raises(ValueError, match="needs a config with timeline=True"):
        fp8.gemm_fp8(x, w, s1, s1, timeline=torch.zeros(64, dtype=torch.int64))
    with pytest.raises(ValueError, match="stamps a timeline"):
        fp8.gemm_fp8(x, w, s1, s1, config=tl_cfg)
    with pytest.raises(ValueError, match="stamps a timeline"):  # too few words
        fp8.gemm_fp8(x, w, s1, s1, config=tl_cfg, timeline=torch.zeros(7, dtype=torch.int64))


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
    # the bulk-copy ring: stages < iterations, = iterations + 1 (all in flight at once), a
    # K split with interleaved and contiguous K orders, two warps along N, a clamped last tile
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
    (Fp8Config(m_tile=8, tiles=2, warps_k=2, ki=0, hw=2, bulk=3, xahead=2, l2pre=3), 3, 40, 768),
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
    sa, sb = _scales(rng, ka, m, k, "a"), _scales(rng, kb_, n, k, "b")
    out, calls = emulate(cfg, x, w, sa, sb, KIND_CODES[ka], KIND_CODES[kb_])
    ok, rel = _close(out, _ref64(x, w, sa, sb, ka, kb_), x, w)
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
    sa, sb = _scales(rng, "block", m, k, "a"), _scales(rng, "block", n, k, "b")
    out, _ = emulate(cfg, x, w, sa, sb, 2, 2, x_stride=k + 48, sa_strides=(1, m),
                     sb_strides=(1, sb.shape[0]))
    ok, rel = _close(out, _ref64(x, w, sa, sb, "block", "block"), x, w)
    assert ok, rel


def test_emulator_catches_mismatched_k_permutation():
    """Negative control: if the weights' hardware conversion put its bytes in another order than
    x's, the products pair the wrong K positions and the comparison fails."""
    cfg = Fp8Config(m_tile=8, tiles=1, warps_k=1, hw=4)
    m, n, k = 4, 16, 128
    rng = np.random.default_rng(3)
    x, w = random_e4m3_bytes(rng, (m, k)), random_e4m3_bytes(rng, (n, k))
    sa, sb = np.ones((1, 1), np.float32), np.ones((1, 1), np.float32)
    ref = _ref64(x, w, sa, sb, "tensor", "tensor")
    out, _ = emulate(cfg, x, w, sa, sb, 0, 0)
    assert _close(out, ref, x, w)[0]
    orig = NumpyOps.mma

    def mma_with_swapped_b(self, a, b, c):  # b halves exchanged: the weights in another K order
        return orig(self, a, [((v >> 16) | (v << 16)) & 0xFFFFFFFF for v in b], c)

    NumpyOps.mma = mma_with_swapped_b
    try:
        bad, _ = emulate(cfg, x, w, sa, sb, 0, 0)
    finally:
        NumpyOps.mma = orig
    assert not _close(bad, ref, x, w)[0]


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
    assert _close(out, _ref64(x, w, sa, sb, "tensor", "tensor"), x, w)[0]
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
    """A table row with an L2 prefetch (o_proj, q_b, down at M <= 8) does not empty the sweeps
    around it: neighbours with other iteration counts prefetch all of theirs (the row prefetched
    all) or none, and the rings and grids keep their size."""
    for name in ("o_proj", "q_b", "mlp_down"):
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
    _need_cutlass()
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


# --------------------------------------------------------------------------------------
# compiled for sm_90a on the CPU
# --------------------------------------------------------------------------------------
def _need_cutlass():
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


def _default_cases():
    seen = {}
    for name, (n, k) in SHAPES.items():
        for m in (1, 16):
            seen.setdefault((fp8.default_fp8_config(m, n, k), n, k), name)
    return seen


@pytest.fixture(scope="module")
def default_ptx():
    _need_cutlass()
    return {key: (name, fp8.compile_fp8_for_arch(key[0], key[1], key[2]))
            for key, name in _default_cases().items()}


def test_ptx_of_default_configs(default_ptx):
    for (cfg, _n, k), (name, ptx) in default_ptx.items():
        tag = f"{name} {cfg.key()}"
        assert ".target sm_90a" in ptx, tag
        nit, r, u = cfg.iterations(k), cfg.tiles, cfg.unroll
        w_loads = ptx.count("ld.global.nc.L1::no_allocate.L2::256B.v4.u32")
        if cfg.bulk:  # through the ring: one copy per iteration, one shared load per vector
            w_loads = ptx.count("ld.shared.v4.u32")
            assert ptx.count("cp.async.bulk.shared::cluster.global") == nit, tag
        assert w_loads == nit * u * 2 * r, (tag, w_loads)  # one 16-byte vector per tile and K step
        x_loads = ptx.count("ld.global.v4.u32")
        assert x_loads == nit * u * 2 * (cfg.m_tile // 8), (tag, x_loads)
        mmas = ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
        assert mmas == nit * u * 8 * r, (tag, mmas)
        words = nit * u * 2 * (r + cfg.m_tile // 8)  # 16-byte vectors converted
        assert ptx.count("cvt.rn.f16x2.e4m3x2") == words * cfg.hw * 2, tag
        assert ptx.count("shr.b32 m, ") == words * (4 - cfg.hw), tag  # one per integer conversion
        wait = ptx.index("griddepcontrol.wait")
        ahead = min(cfg.depth, nit)  # the first `depth` iterations' weights precede the wait
        if cfg.bulk:
            assert ptx.count("cp.async.bulk.shared::cluster.global", 0, wait) == min(cfg.bulk - 1, nit), tag
        else:
            assert ptx.count("ld.global.nc.L1::no_allocate", 0, wait) == ahead * u * 2 * r, tag
        assert ptx.find("ld.global.v4.u32") > wait, tag  # x (written by the previous kernel) after it
        assert ptx.count("ld.global.nc.f32") == nit * u, tag  # one weight block scale per K block
        assert ".local" not in ptx, tag


def test_sass_loads_before_wait_no_spills_registers_fit():
    """What ptxas made of it: the first weight vectors (LDG.E.NA) are issued before
    griddepcontrol.wait (ACQBULK), nothing spills, and the launch bound's register budget holds."""
    _need_cutlass()
    if ec.nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed (dev extra nvidia-cuda-nvdisasm)")
    import subprocess
    import tempfile

    from executors.cute import _lock, cubin_of, fp8_kernels
    from executors.cute.fp8_config import blocks_per_sm

    for name in ("qkv_a", "mlp_gate_up", "qkvg", "fa_beta"):
        n, k = SHAPES[name]
        for m in (1, 16):
            cfg = fp8.default_fp8_config(m, n, k)

            def build(opts, cfg=cfg, n=n, k=k):
                return fp8_kernels.compile_tvm_ffi(cfg, n, k, 2, 2, 0, extra_options=opts)

            with _lock:
                cub = cubin_of(build, "sm_90a")
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(cub)
                f.flush()
                sass = subprocess.run([ec.nvdisasm_path(), "-c", f.name], capture_output=True,
                                      text=True, check=True).stdout
            wait = sass.index("ACQBULK")
            if cfg.bulk:  # the bulk ring's first S - 1 copies (measured default of some shapes)
                assert sass.count("UBLKCP", 0, wait) == cfg.bulk - 1, (name, cfg.key())
            else:
                assert sass.count("LDG.E.NA", 0, wait) >= 2 * cfg.tiles * cfg.unroll, (name, cfg.key())
            assert sass.count("ACQBULK") == 1
            assert "STL" not in sass and "LDL" not in sass, (name, cfg.key())
            assert sass.count("HMMA.16816.F32") == cfg.iterations(k) * cfg.unroll * 8 * cfg.tiles
            regs = ec.cubin_regcount(cub)
            # the whole grid is resident at once (no second wave), by registers and threads
            per_sm = blocks_per_sm(cfg, regs)
            assert cfg.grid(n) <= fp8.SMS * per_sm, (name, cfg.key(), regs, per_sm)


def test_sass_bulk_ring_copies_before_wait_no_spills():
    """The bulk ring as ptxas made it: one bulk copy (UBLKCP) per iteration, the first S - 1 of
    them before griddepcontrol.wait, one shared load per weight vector, nothing spilled."""
    _need_cutlass()
    if ec.nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed (dev extra nvidia-cuda-nvdisasm)")
    cases = [(Fp8Config(m_tile=16, tiles=2, warps_k=4, unroll=2, hw=4, bulk=4), "mlp_gate_up"),
             (Fp8Config(m_tile=8, tiles=1, warps_k=2, unroll=1, hw=4, bulk=3), "qkv_a")]
    for cfg, name in cases:
        n, k = SHAPES[name]
        sass = fp8.compile_fp8_for_arch(cfg, n, k, sass=True)
        wait = sass.index("ACQBULK")
        nit = cfg.iterations(k)
        assert sass.count("UBLKCP") == nit and sass.count("UBLKCP", 0, wait) == cfg.bulk - 1, cfg.key()
        assert sass.count("LDS.128") == nit * cfg.unroll * 2 * cfg.tiles
        assert "LDG.E.NA" not in sass  # no weight vector goes through registers
        assert "STL" not in sass and "LDL" not in sass, cfg.key()


def test_bulk_grid_fits_and_keeps_bytes_in_flight():
    """fp8_bulk_grid's candidates: rings that fit the shape and shared memory, a whole grid
    resident at once, and at least 48 KiB of weights in flight per SM."""
    from executors.cute.fp8_config import SMEM_PER_BLOCK, blocks_per_sm

    for m, (n, k) in ((8, SHAPES["qkv_a"]), (16, SHAPES["mlp_gate_up"]), (16, SHAPES["qkvg"])):
        grid = fp8.fp8_bulk_grid(m, n, k)
        assert grid[0] == fp8.default_fp8_config(m, n, k) and len(grid) > 5
        for c in grid[1:]:
            assert c.bulk >= 2 and c.check(m, n, k) is None and c.smem_bytes() <= SMEM_PER_BLOCK
            per = blocks_per_sm(c)
            assert c.grid(n) <= fp8.SMS * per
            resident = min(per, -(-c.grid(n) // fp8.SMS))
            assert (c.bulk - 1) * c.bulk_stage_bytes() * c.warps_k * resident >= 48 * 1024


@pytest.mark.parametrize("ka,kb_,out", [("tensor", "tensor", "bfloat16"), ("row", "col", "float32"),
                                        ("block", "tensor", "bfloat16"), ("tensor", "block", "float32"),
                                        ("row", "block", "bfloat16"), ("block", "col", "float32")])
def test_ptx_scale_kinds_and_out_dtypes(ka, kb_, out):
    """Each kind loads what it needs: block kinds once per K block (scale_a after the PDL wait,
    scale_b before it), tensor kinds once, row / column kinds in the epilogue; fp32 out stores
    32-bit values, bf16 out converts."""
    _need_cutlass()
    cfg = Fp8Config(m_tile=16, tiles=2, warps_k=2, unroll=1)
    n, k = 256, 512
    ptx = fp8.compile_fp8_for_arch(cfg, n, k, ka, kb_, out)
    nit = cfg.iterations(k)
    wait = ptx.index("griddepcontrol.wait")
    sb_loads = ptx.count("ld.global.nc.f32")
    sa_loads = ptx.count("ld.global.f32")
    outs = -(-cfg.warps_n * cfg.tiles * cfg.m_tile * 8 // cfg.threads())  # reduction passes
    want_sb = {"tensor": 1, "col": outs, "block": nit * cfg.unroll}[kb_]
    want_sa = {"tensor": 1, "row": outs, "block": 2 * nit * cfg.unroll}[ka]
    assert (sa_loads, sb_loads) == (want_sa, want_sb), (sa_loads, sb_loads)
    # before the wait: the tensor / iteration-0 block weight scale, no activation scale
    assert ptx.count("ld.global.nc.f32", 0, wait) == (0 if kb_ == "col" else 1)
    assert ptx.count("ld.global.f32", 0, wait) == 0
    stores32 = len(re.findall(r"st\.global\.(?:b32|f32)", ptx))
    stores16 = len(re.findall(r"st\.global\.(?:b16|u16)", ptx))
    if out == "float32":
        assert stores32 == outs and stores16 == 0 and "cvt.rn.bf16.f32" not in ptx
    else:
        assert stores16 == outs and stores32 == 0 and ptx.count("cvt.rn.bf16.f32") == outs


def test_ptx_early_launch_of_the_next_kernel():
    """early: griddepcontrol.launch_dependents once, before the weight loads and the wait;
    otherwise once, after the wait."""
    _need_cutlass()
    cfg = Fp8Config(m_tile=8, tiles=2, warps_k=2, depth=2)
    for early in (False, True):
        ptx = fp8.compile_fp8_for_arch(dataclasses.replace(cfg, early=early), 256, 1024)
        wait, launch = ptx.index("griddepcontrol.wait"), ptx.index("griddepcontrol.launch_dependents")
        assert ptx.count("griddepcontrol.launch_dependents") == 1
        assert (launch < ptx.index("ld.global.nc.L1::no_allocate")) == early and (launch < wait) == early


def test_ptx_timeline_stamps_and_same_kernel_otherwise():
    """timeline: four %globaltimer stamps and the SM id from thread 0, one more kernel
    parameter (the buffer); the loads and mma as without it."""
    _need_cutlass()
    cfg = Fp8Config(m_tile=8, tiles=2, warps_k=2, depth=2)
    ptx = fp8.compile_fp8_for_arch(dataclasses.replace(cfg, timeline=True), 256, 1024)
    base = fp8.compile_fp8_for_arch(cfg, 256, 1024)
    assert ptx.count("%globaltimer") == 4 and ptx.count("%smid") == 1 and "%globaltimer" not in base
    assert ptx.count(".param") > base.count(".param")  # the timeline tensor
    for op in ("ld.global.nc.L1::no_allocate", "mma.sync", "griddepcontrol.wait", "ld.global.v4"):
        assert ptx.count(op) == base.count(op), op
    assert dataclasses.replace(cfg, timeline=True).key().endswith("_tl_pdl1")


def test_without_pdl_no_griddepcontrol():
    _need_cutlass()
    ptx = fp8.compile_fp8_for_arch(Fp8Config(m_tile=8, tiles=2, warps_k=2, pdl=False), 256, 512)
    assert "griddepcontrol" not in ptx and "mma.sync" in ptx


def test_sweep_configs_compile():
    """Every candidate the bench sweeps for a large and a small shape compiles (no local arrays)."""
    _need_cutlass()
    for m, (n, k) in ((8, SHAPES["qkv_a"]), (16, SHAPES["fb"])):
        for cfg in fp8.fp8_configs_for(m, n, k):
            ptx = fp8.compile_fp8_for_arch(cfg, n, k)
            assert ".local" not in ptx and "mma.sync" in ptx, cfg.key()


def test_kernel_cache_key_covers_the_kernel_sources():
    """Every package module the kernel code imports is hashed into the disk-cache key, so an edit
    to any of them recompiles instead of loading a stale kernel."""
    import ast
    from pathlib import Path

    pkg = Path(fp8.__file__).parent
    need = {"fp8_kernels.py", "fp8_lane.py"}
    for name in ("fp8_kernels.py", "fp8_lane.py"):
        for node in ast.walk(ast.parse((pkg / name).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                need.add(node.module.split(".")[0] + ".py")
    assert need <= set(fp8.KERNEL_SOURCES), need - set(fp8.KERNEL_SOURCES)


def test_kernel_cache_key_has_kinds_and_dtype():
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    cfg = Fp8Config()
    names = {fp8._tag(cfg, 256, 512, a, b, o, "sm_90a")[0] for a in (0, 1, 2) for b in (0, 1, 2) for o in (0, 1)}
    assert len(names) == 18
    assert fp8._tag(dataclasses.replace(cfg, hw=3), 256, 512, 2, 2, 0, "sm_90a")[0] not in names


# --------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------
def _gpu_operands(m, n, k, ka, kb_, seed, device="cuda"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, generator=g) * 2).to(torch.float8_e4m3fn)
    kbn = -(-k // BLOCK)
    sa = {"tensor": torch.rand((), generator=g), "row": torch.rand(m, 1, generator=g),
          "block": torch.rand(m, kbn, generator=g)}[ka] * 0.02 + 0.005
    nb = -(-n // BLOCK)
    sb = {"tensor": torch.rand((), generator=g), "col": torch.rand(n, 1, generator=g),
          "block": torch.rand(nb, kbn, generator=g)}[kb_] * 0.02 + 0.005
    return [t.to(device) for t in (x, w, sa, sb)]


def _check_gpu(out, ref, tag, rel_tol):
    o = out.float()
    assert torch.isfinite(o).all(), f"{tag}: non-finite output (unwritten?)"
    rel = ((o - ref).norm() / ref.norm()).item()
    assert rel < rel_tol, f"{tag}: rel err {rel}"


GPU_SHAPES = ["qkv_a", "q_b", "kv_b", "shared_gate_up", "shared_down", "fa_beta", "fb"]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", list(range(1, 17)))
@pytest.mark.parametrize("name", GPU_SHAPES)
def test_gpu_block_scales(name, m):
    n, k = SHAPES[name]
    x, w, sa, sb = _gpu_operands(m, n, k, "block", "block", 1000 * m + n)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    fp8.gemm_fp8(x, w, sa, sb, out)
    torch.cuda.synchronize()
    _check_gpu(out, fp8.dequant_reference(x, w, sa, sb), f"{name} M={m}", 6e-3)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("kinds", [("tensor", "tensor"), ("row", "col"), ("block", "tensor"),
                                   ("tensor", "block"), ("row", "block"), ("block", "col")])
def test_gpu_scale_kinds_fp32_out(kinds, m):
    n, k = 1000, 1024  # N ends in a partial 128-row block and a partial n8 tile pair
    x, w, sa, sb = _gpu_operands(m, n, k, *kinds, seed=m)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    fp8.gemm_fp8(x, w, sa, sb, out)
    torch.cuda.synchronize()
    _check_gpu(out, fp8.dequant_reference(x, w, sa, sb), f"{kinds} M={m}", 1e-5)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 7, 16])
def test_gpu_strided_views(m):
    """x a column slice of a wider buffer, column-major activation scales, out a column slice."""
    n, k = 2112, 7168
    x0, w, sa, sb = _gpu_operands(m, n, k, "block", "block", seed=5 + m)
    big = torch.zeros(m, k + 256, device="cuda", dtype=torch.float8_e4m3fn)
    big[:, 128:128 + k] = x0
    x = big[:, 128:128 + k]
    sa_cm = sa.t().contiguous().t()
    obuf = torch.full((m, n + 64), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = obuf[:, 32:32 + n]
    fp8.gemm_fp8(x, w, sa_cm, sb, out)
    torch.cuda.synchronize()
    _check_gpu(out, fp8.dequant_reference(x0, w, sa, sb), f"strided M={m}", 6e-3)
    assert torch.isnan(obuf[:, :32].float()).all() and torch.isnan(obuf[:, 32 + n:].float()).all()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [4, 12])
def test_gpu_every_sweep_config(m):
    _check_gpu_configs(m, ("qkv_a",), fp8.fp8_configs_for, seed=77)


def _check_gpu_configs(m, names, configs_of, seed):
    """Every config configs_of(m, n, k) gives at each named shape against the fp32 reference,
    on poisoned outputs."""
    for name in names:
        n, k = SHAPES[name]
        x, w, sa, sb = _gpu_operands(m, n, k, "block", "block", seed=seed)
        ref = fp8.dequant_reference(x, w, sa, sb)
        for cfg in configs_of(m, n, k):
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            fp8.gemm_fp8(x, w, sa, sb, out, config=cfg)
            torch.cuda.synchronize()
            _check_gpu(out, ref, cfg.key(), 6e-3)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [3, 16])
def test_gpu_bulk_ring_configs(m):
    """Bulk-copy rings (a sample of fp8_bulk_grid) against the fp32 reference, poisoned outputs,
    at two shapes and two M."""
    _check_gpu_configs(m, ("qkv_a", "mlp_gate_up"), lambda m, n, k: fp8.fp8_bulk_grid(m, n, k)[1::7], seed=31)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [5, 16])
def test_gpu_l2_prefetch_configs(m):
    """L2 prefetch before the PDL wait (a sample of fp8_pre_grid) against the fp32 reference,
    poisoned outputs, at two shapes and two M."""
    _check_gpu_configs(m, ("qkv_a", "o_proj"),
                       lambda m, n, k: [c for c in fp8.fp8_pre_grid(m, n, k) if c.l2pre][::4], seed=41)


@pytest.mark.gpu
@gpu
def test_gpu_timeline_stamps_in_order():
    """A timeline config computes the same output and stamps every block in order (start <=
    weights issued <= past the wait <= end) with its SM id; a timeline buffer is required."""
    n, k, m = 512, 1024, 5
    x, w, sa, sb = _gpu_operands(m, n, k, "block", "block", seed=3)
    cfg = dataclasses.replace(fp8.default_fp8_config(m, n, k), timeline=True)
    tl = torch.zeros(cfg.grid(n), 8, dtype=torch.int64, device="cuda")
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    fp8.gemm_fp8(x, w, sa, sb, out, config=cfg, timeline=tl)
    torch.cuda.synchronize()
    _check_gpu(out, fp8.dequant_reference(x, w, sa, sb), cfg.key(), 6e-3)
    t = tl.cpu()
    assert (t[:, 0] > 0).all() and (t[:, 0] <= t[:, 1]).all() and (t[:, 1] <= t[:, 2]).all()
    assert (t[:, 2] <= t[:, 3]).all() and (t[:, 7] >= 0).all() and (t[:, 7] < 1024).all()
    with pytest.raises(ValueError, match="timeline"):
        fp8.gemm_fp8(x, w, sa, sb, out, config=cfg)
    with pytest.raises(ValueError, match="timeline"):
        fp8.gemm_fp8(x, w, sa, sb, out, timeline=tl)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [2, 16])
def test_gpu_graph_replay_side_stream(m):
    n, k = SHAPES["qkvg"]
    x, w, sa, sb = _gpu_operands(m, n, k, "block", "block", seed=9)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fp8.gemm_fp8(x, w, sa, sb, out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        fp8.gemm_fp8(x, w, sa, sb, out)
    for rep in range(3):
        x.copy_((torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn))
        sa.copy_(torch.rand_like(sa) * 0.02 + 0.005)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check_gpu(out, fp8.dequant_reference(x, w, sa, sb), f"graph M={m} rep {rep}", 6e-3)


def test_measured_table_wins_where_it_runs_else_heuristic():
    """default_fp8_config takes the measured row of its (N, K, m_tile), if that row runs the M;
    other shapes, and an unfit row, get the heuristic; every shipped row runs its whole bucket."""
    row = Fp8Config(m_tile=8, tiles=1, warps_k=7, unroll=2, hw=4).to_dict()
    table = {(2112, 7168, 8): row}
    assert fp8.default_fp8_config(5, 2112, 7168, table=table) == Fp8Config.from_dict(row)
    assert fp8.default_fp8_config(12, 2112, 7168, table=table) == fp8.heuristic_fp8_config(12, 2112, 7168)
    assert fp8.default_fp8_config(5, 4096, 512, table=table) == fp8.heuristic_fp8_config(5, 4096, 512)
    unfit = {(2112, 7168, 8): {**row, "warps_k": 5}}  # 56 K blocks do not split 5 x 2 ways
    assert fp8.default_fp8_config(5, 2112, 7168, table=unfit) == fp8.heuristic_fp8_config(5, 2112, 7168)
    assert fp8.default_fp8_config(5, 2112, 7168, table={}) == fp8.heuristic_fp8_config(5, 2112, 7168)
    from executors.cute.fp8_defaults import MEASURED
    for (n, k, mt), d in MEASURED.items():
        cfg = Fp8Config.from_dict(d)
        assert cfg.m_tile == mt
        for m in range(1 if mt == 8 else 9, mt + 1):
            assert cfg.check(m, n, k) is None, ((n, k, mt), m)
            assert fp8.default_fp8_config(m, n, k) == cfg


ROOT = Path(__file__).resolve().parent.parent


def _write_table(tmp_path, record: dict):
    """Run scripts/fp8_defaults_from_sweep.py --fresh on `record`; (its result, the generated
    module's namespace)."""
    import json
    import subprocess
    import sys

    src, out = tmp_path / "rec.json", tmp_path / "table.py"
    src.write_text(json.dumps(record))
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "fp8_defaults_from_sweep.py"), str(src),
                        "--out", str(out), "--fresh"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    ns: dict = {}
    exec(compile(out.read_text(), str(out), "exec"), ns)  # the generated module, read back
    return r, ns


def test_defaults_from_sweep_keeps_clear_wins_only(tmp_path):
    import subprocess
    import sys
    heur8 = fp8.heuristic_fp8_config(8, 2112, 7168)
    heur16 = fp8.heuristic_fp8_config(16, 2112, 7168)
    win = Fp8Config(m_tile=8, tiles=1, warps_k=7, unroll=2, hw=4)
    close = Fp8Config(m_tile=16, tiles=1, warps_k=14, unroll=1, hw=4)
    rec = {"rows": [{"shape": "qkv_a", "N": 2112, "K": 7168}],
           "sweep": {"qkv_a": {"8": {"best": win.to_dict(), "best_us": 5.0,
                                     "all_us": {win.key(): 5.0, heur8.key(): 6.0}},
                               "16": {"best": close.to_dict(), "best_us": 6.95,
                                      "all_us": {close.key(): 6.95, heur16.key(): 7.0}}}}}
    r, ns = _write_table(tmp_path, rec)
    assert ns["MEASURED"] == {(2112, 7168, 8): win.to_dict()}
    assert "heuristic kept" in r.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "fp8_defaults_from_sweep.py"),
                          str(tmp_path / "missing.json")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "cannot read" in bad.stderr


def test_defaults_from_sweep_keeps_provenance_of_carried_rows():
    """A row the record does not improve keeps the comment saying where it was measured; a row
    it replaces names the row it replaced with that row's time in the record."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fp8_from_sweep", ROOT / "scripts" / "fp8_defaults_from_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    old8 = Fp8Config(m_tile=8, tiles=2, warps_k=7, hw=4)
    old16 = Fp8Config(m_tile=16, tiles=2, warps_k=7, hw=4)
    text = ("MEASURED = {\n    # qkv_a: 5.10 us on an earlier record\n    (2112, 7168, 8): {},\n"
            "    # qkv_a: 7.00 us there\n    (2112, 7168, 16): {},\n    # other: 1.00 us\n    (64, 128, 8): {},\n}\n")
    comments = mod.row_comments(text)
    assert comments[(2112, 7168, 8)] == "qkv_a: 5.10 us on an earlier record"
    ring = Fp8Config(m_tile=16, tiles=2, warps_k=4, unroll=2, hw=4, bulk=2)
    rec = {"rows": [{"shape": "qkv_a", "N": 2112, "K": 7168}],
           "sweep": {"qkv_a": {"8": {"best": old8.to_dict(), "best_us": 5.0, "all_us": {old8.key(): 5.0}},
                               "16": {"best": ring.to_dict(), "best_us": 6.0,
                                      "all_us": {ring.key(): 6.0, old16.key(): 7.0}}}}}
    current = {(2112, 7168, 8): old8.to_dict(), (2112, 7168, 16): old16.to_dict(), (64, 128, 8): old8.to_dict()}
    table, _ = mod.rows_from(rec, 0.02, current, comments=comments)
    assert table[(2112, 7168, 8)][1] == "qkv_a: 5.10 us on an earlier record"
    assert table[(64, 128, 8)][1] == "other: 1.00 us"
    assert table[(2112, 7168, 16)][0] == ring.to_dict()
    assert f"replaces {old16.key()}, 7.00 us in this record" in table[(2112, 7168, 16)][1]
    assert mod._source("b.json", "a.json (rows it did not improve: z.json)", False) == \
        "b.json (rows it did not improve: a.json, z.json)"
    assert mod._source("b.json", "b.json", False) == "b.json" and mod._source("b.json", "x", False) == "b.json"
    # a current row the record measured slower than a config within 2 % of the heuristic goes
    heur = fp8.heuristic_fp8_config(16, 2112, 7168)
    rec["sweep"]["qkv_a"]["16"]["all_us"] = {ring.key(): 5.0, old16.key(): 7.0, heur.key(): 5.05}
    rec["sweep"]["qkv_a"]["16"]["best_us"] = 5.0
    table, notes = mod.rows_from(rec, 0.02, current, comments=comments)
    assert (2112, 7168, 16) not in table and any("heuristic kept" in n for n in notes)
    assert (64, 128, 8) in table


def test_per_tensor_scales_take_their_own_measured_row(monkeypatch):
    """kinds ("tensor", "tensor") look in MEASURED_TENSOR first (a config measured with per-tensor
    scales), then the block-scale row, then the heuristic; other kinds never see that table."""
    from executors.cute import fp8_config

    n, k = 4608, 7168
    own = Fp8Config(m_tile=16, tiles=2, warps_k=7, unroll=1, hw=2)
    monkeypatch.setattr(fp8_config, "MEASURED_TENSOR", {(n, k, 16): own.to_dict()})
    assert fp8.default_fp8_config(12, n, k, kinds=("tensor", "tensor")) == own
    block = fp8.default_fp8_config(12, n, k)
    assert block != own
    assert fp8.default_fp8_config(12, n, k, kinds=("row", "col")) == block
    assert fp8.default_fp8_config(12, n, k, kinds=("block", "tensor")) == block
    assert fp8.default_fp8_config(5, n, k, kinds=("tensor", "tensor")) == fp8.default_fp8_config(5, n, k)


def test_defaults_from_a_per_tensor_sweep_fill_their_table(tmp_path):
    """A `--sweep-kinds tensor` record writes MEASURED_TENSOR rows where they beat what per-tensor
    scales ran before (the block-scale default), and leaves MEASURED as it was."""

    from executors.cute import fp8_defaults

    n, k = 4608, 7168
    before16 = fp8.default_fp8_config(16, n, k)
    before8 = fp8.default_fp8_config(8, n, k)
    win = Fp8Config(m_tile=16, tiles=2, warps_k=7, unroll=1, hw=2)
    rec = {"rows": [{"shape": "gate_up", "N": n, "K": k}], "sweep_kinds": "tensor",
           "sweep": {"gate_up": {"16": {"best": win.to_dict(), "best_us": 12.0,
                                        "all_us": {win.key(): 12.0, before16.key(): 17.0}},
                                 "8": {"best": before8.to_dict(), "best_us": 11.0,
                                       "all_us": {before8.key(): 11.0}}}}}
    _r, ns = _write_table(tmp_path, rec)
    assert ns["MEASURED_TENSOR"] == {(n, k, 16): win.to_dict()}  # M <= 8: the default was the best
    assert ns["MEASURED"] == fp8_defaults.MEASURED and ns["SOURCE"] == fp8_defaults.SOURCE
