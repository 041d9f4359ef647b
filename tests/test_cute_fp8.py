"""Tests for the CuTe DSL fp8 skinny GEMM (executors.cute.fp8): the pure parts and the kernel
compiled for sm_90a on the CPU.

CPU, pure: the integer e4m3 -> f16 conversion against torch for every byte, the scale-kind
inference, the per-K-block scaling order against dequantize-then-matmul, the configs, the K
schedule, the input checks of gemm_fp8.
CPU, cutlass: every default config of the DeepSeek-V3 / KDA shapes compiles for sm_90a; PTX and
SASS show the 16-byte non-coherent weight loads ahead of griddepcontrol.wait, the f16 mma, both
conversions, no spills; the prefetch, early launch and timeline options in PTX.
The lane program under the emulator: test_cute_fp8_emu.py; on a GPU: test_cute_fp8_gpu.py; the
measured config table: test_cute_fp8_table.py.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import executors.cute as ec
from executors.cute import fp8
from executors.cute.fp8 import Fp8Config
from executors.cute.fp8_lane import k_block
from tests.fp8cases import E4M3, SHAPES, need_cutlass, ref64, scales
from tests.fp8emu import E4M3_F16, NumpyOps, f16_halves, random_e4m3_bytes


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
    sa = torch.from_numpy(scales(rng, ka, m, k, "a"))
    sb = torch.from_numpy(scales(rng, kb_, n, k, "b"))
    ref = ref64(x.view(torch.uint8).numpy(), w.view(torch.uint8).numpy(), sa.numpy(), sb.numpy(),
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
# compiled for sm_90a on the CPU
# --------------------------------------------------------------------------------------

def _default_cases():
    seen = {}
    for name, (n, k) in SHAPES.items():
        for m in (1, 16):
            seen.setdefault((fp8.default_fp8_config(m, n, k), n, k), name)
    return seen


@pytest.fixture(scope="module")
def default_ptx():
    need_cutlass()
    return {key: (name, fp8.compile_fp8_for_arch(key[0], key[1], key[2]))
            for key, name in _default_cases().items()}


def _check_wgr_ptx(cfg, ptx, tag):
    """A register-weights warpgroup default: 4 weight vectors and 4 wgmma per K block, the first
    depth blocks' vectors before the wait, x staged after it, no f16 mma or conversion."""
    u = cfg.unroll
    assert ptx.count("ld.global.nc.L1::no_allocate.L2::256B.v4.u32") == 4 * u, tag
    assert ptx.count(f"wgmma.mma_async.sync.aligned.m64n{cfg.m_tile}k32.f32.e4m3.e4m3") == 4 * u, tag
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.count("ld.global.nc.L1::no_allocate", 0, wait) == 4 * cfg.depth, tag
    assert ptx.find("ld.global.v4.u32") > wait and ptx.count("st.shared.b32") >= 4, tag
    assert "mma.sync" not in ptx and "cvt.rn.f16x2.e4m3x2" not in ptx, tag
    assert ptx.count("ld.global.nc.f32") == u, tag  # one weight block scale per K block
    assert ".local" not in ptx, tag


def test_ptx_of_default_configs(default_ptx):
    for (cfg, _n, k), (name, ptx) in default_ptx.items():
        tag = f"{name} {cfg.key()}"
        assert ".target sm_90a" in ptx, tag
        if cfg.wgr:
            _check_wgr_ptx(cfg, ptx, tag)
            continue
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
            assert ptx.count("cp.async.bulk.shared::cluster.global", 0, wait) == min(cfg.bulk, nit), tag
        else:
            assert ptx.count("ld.global.nc.L1::no_allocate", 0, wait) == ahead * u * 2 * r, tag
        assert ptx.find("ld.global.v4.u32") > wait, tag  # x (written by the previous kernel) after it
        assert ptx.count("ld.global.nc.f32") == nit * u, tag  # one weight block scale per K block
        assert ".local" not in ptx, tag


def test_sass_loads_before_wait_no_spills_registers_fit():
    """What ptxas made of it: the first weight vectors (LDG.E.NA) are issued before
    griddepcontrol.wait (ACQBULK), nothing spills, and the launch bound's register budget holds."""
    need_cutlass()
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
            if cfg.bulk:  # the bulk ring's S stages (measured default of some shapes)
                assert sass.count("UBLKCP", 0, wait) == cfg.loaded_first(k), (name, cfg.key())
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
    """The bulk ring as ptxas made it: one bulk copy (UBLKCP) per iteration, the first S of
    them before griddepcontrol.wait, one shared load per weight vector, nothing spilled."""
    need_cutlass()
    if ec.nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed (dev extra nvidia-cuda-nvdisasm)")
    cases = [(Fp8Config(m_tile=16, tiles=2, warps_k=4, unroll=2, hw=4, bulk=4), "mlp_gate_up"),
             (Fp8Config(m_tile=8, tiles=1, warps_k=2, unroll=1, hw=4, bulk=3), "qkv_a")]
    for cfg, name in cases:
        n, k = SHAPES[name]
        sass = fp8.compile_fp8_for_arch(cfg, n, k, sass=True)
        wait = sass.index("ACQBULK")
        nit = cfg.iterations(k)
        assert sass.count("UBLKCP") == nit and sass.count("UBLKCP", 0, wait) == cfg.loaded_first(k), cfg.key()
        assert sass.count("LDS.128") == nit * cfg.unroll * 2 * cfg.tiles
        assert "LDG.E.NA" not in sass  # no weight vector goes through registers
        assert "STL" not in sass and "LDL" not in sass, cfg.key()


def test_hold_grid_leaves_room_for_the_next_kernel():
    """fp8_hold_grid's candidates: rings with the early launch and a launch bound of twice their
    resident blocks, which an SM holds by shared memory and threads with >= 64 registers each."""
    from executors.cute.fp8_config import blocks_per_sm, resident_per_sm

    for m, (n, k) in ((8, SHAPES["qkv_a"]), (16, SHAPES["o_proj"]), (8, SHAPES["qkvg"])):
        grid = fp8.fp8_hold_grid(m, n, k)
        assert grid[0] == fp8.default_fp8_config(m, n, k) and len(grid) > 5
        for c in grid[1:]:
            assert c.early and 1 <= c.bulk <= c.iterations(k) and c.check(m, n, k) is None, c.key()
            two = 2 * resident_per_sm(c, n)
            assert c.minb == two and blocks_per_sm(c) >= two and 65536 // (two * c.threads()) >= 64


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
    need_cutlass()
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
    need_cutlass()
    cfg = Fp8Config(m_tile=8, tiles=2, warps_k=2, depth=2)
    for early in (False, True):
        ptx = fp8.compile_fp8_for_arch(dataclasses.replace(cfg, early=early), 256, 1024)
        wait, launch = ptx.index("griddepcontrol.wait"), ptx.index("griddepcontrol.launch_dependents")
        assert ptx.count("griddepcontrol.launch_dependents") == 1
        assert (launch < ptx.index("ld.global.nc.L1::no_allocate")) == early and (launch < wait) == early


def test_ptx_timeline_stamps_and_same_kernel_otherwise():
    """timeline: four %globaltimer stamps and the SM id from thread 0, one more kernel
    parameter (the buffer); the loads and mma as without it."""
    need_cutlass()
    cfg = Fp8Config(m_tile=8, tiles=2, warps_k=2, depth=2)
    ptx = fp8.compile_fp8_for_arch(dataclasses.replace(cfg, timeline=True), 256, 1024)
    base = fp8.compile_fp8_for_arch(cfg, 256, 1024)
    assert ptx.count("%globaltimer") == 4 and ptx.count("%smid") == 1 and "%globaltimer" not in base
    assert ptx.count(".param") > base.count(".param")  # the timeline tensor
    for op in ("ld.global.nc.L1::no_allocate", "mma.sync", "griddepcontrol.wait", "ld.global.v4"):
        assert ptx.count(op) == base.count(op), op
    assert dataclasses.replace(cfg, timeline=True).key().endswith("_tl_pdl1")


def test_without_pdl_no_griddepcontrol():
    need_cutlass()
    ptx = fp8.compile_fp8_for_arch(Fp8Config(m_tile=8, tiles=2, warps_k=2, pdl=False), 256, 512)
    assert "griddepcontrol" not in ptx and "mma.sync" in ptx


def test_sweep_configs_compile():
    """Every candidate the bench sweeps for a large and a small shape compiles (no local arrays)."""
    need_cutlass()
    for m, (n, k) in ((8, SHAPES["qkv_a"]), (16, SHAPES["fb"])):
        for cfg in fp8.fp8_configs_for(m, n, k):
            ptx = fp8.compile_fp8_for_arch(cfg, n, k)
            assert ".local" not in ptx and "mma.sync" in ptx, cfg.key()


def test_kernel_cache_key_covers_the_kernel_sources():
    """Every package module the kernel code imports is hashed into the disk-cache key, so an edit
    to any of them recompiles instead of loading a stale kernel."""
    import ast

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
