"""Tests for executors.cute.bound, the launch-bound kernels of scripts/bench_launch_bound.py.

CPU, pure: the stream configs' checks and the bench's candidates at every fp8 bench shape.
CPU, cutlass: the kernels compile for sm_90a; in SASS the stream kernel issues exactly its `pre`
loads before griddepcontrol.wait (ACQBULK) and the rest after, no spills; without PDL there is no
wait. On a GPU: the kernels' outputs (the XOR of the weight's words, x's first word).
"""

import pytest
import torch

import executors.cute as ec
from executors.cute import bound
from executors.cute.bound import MAX_PER, MAX_PRE, StreamCfg
from tests.fp8cases import SHAPES, need_cutlass


def test_config_checks_name_what_is_wrong():
    assert StreamCfg().check(2112, 7168) is None
    assert "multiple of 16" in StreamCfg().check(3, 5)
    assert "threads" in StreamCfg(threads=100).check(2112, 7168)
    assert "pre" in StreamCfg(pre=MAX_PRE + 1).check(2112, 7168)
    assert "larger grid" in StreamCfg(grid=1, threads=32).check(2112, 7168)
    assert "need pdl" in StreamCfg(pre=4, pdl=False).check(2112, 7168)
    assert "not 1 or 8" in StreamCfg(rows=4).check(2112, 7168)
    assert "K % 64" in StreamCfg(rows=8).check(2112, 7200)
    assert "N % 8" in StreamCfg(rows=8).check(2113, 7168)
    with pytest.raises(ValueError, match="cannot stream"):
        bound._compile_tvm_ffi(StreamCfg(threads=100), 2112, 7168, True)


@pytest.mark.parametrize("name", list(SHAPES))
def test_candidates_cover_every_shape(name):
    n, k = SHAPES[name]
    cands = bound.stream_configs(n, k)
    assert len(cands) >= 4 and len(set(cands)) == len(cands)
    assert all(c.check(n, k) is None for c in cands)
    assert sum(not c.pdl for c in cands) == 1  # the no-PDL reference
    assert any(c.early for c in cands) and any(not c.early and c.pdl for c in cands)
    for c in cands:
        assert c.grid * c.threads * c.per(n, k) * 16 >= n * k > c.grid * c.threads * (c.per(n, k) - 1) * 16
        assert c.per(n, k) <= MAX_PER


@pytest.mark.parametrize("cfg,n,k", [(StreamCfg(2, 64, rows=8), 48, 320), (StreamCfg(3, 96, rows=8), 40, 640),
                                     (StreamCfg(2, 64), 48, 320)])
def test_vector_reads_every_weight_vector_once(cfg, n, k):
    """Over all threads and loads, the in-range vectors are each of the weight's once; with rows 8
    each warp load is 8 rows x 64 contiguous bytes, and a warp's next load the next 64 bytes of
    the same rows unless its rows ended."""
    kv = k // 16
    seen = []
    for gw in range(cfg.grid * cfg.threads // 32):
        prev = None
        for i in range(cfg.per(n, k)):
            got = [bound.vector(cfg, n, k, gw * 32 + lane, i) for lane in range(32)]
            inside = [ok for _, ok in got]
            assert len(set(inside)) == 1  # a warp load is all in or all out
            assert all(0 <= v < n * kv for v, _ in got)
            if not inside[0]:
                continue
            idx = [v for v, _ in got]
            seen += idx
            if cfg.rows == 8:
                rows = [v // kv for v in idx]
                cols = [v % kv for v in idx]
                assert rows == [rows[0] + lane // 4 for lane in range(32)] and rows[0] % 8 == 0
                assert cols == [cols[0] + lane % 4 for lane in range(32)] and cols[0] % 4 == 0
                if prev is not None and cols[0]:
                    assert rows[0] == prev[0] and cols[0] == prev[1] + 4
                prev = rows[0], cols[0]
    assert sorted(seen) == list(range(n * kv))


def test_rows_candidates():
    cands = bound.stream_configs(4608, 7168, (1, 8))
    assert {c.rows for c in cands} == {1, 8}
    assert len([c for c in cands if c.rows == 8]) == len([c for c in cands if c.rows == 1 and c.pdl])
    assert all(c.key().endswith("_r8") == (c.rows == 8) for c in cands)


def _loads_around_wait(sass: str) -> tuple[int, int]:
    lines = [ln for ln in sass.splitlines() if "LDG" in ln or "ACQBULK" in ln]
    wait = next((i for i, ln in enumerate(lines) if "ACQBULK" in ln), None)
    if wait is None:
        return len(lines), -1
    return wait, len(lines) - wait - 1


@pytest.mark.parametrize("cfg,n,k", [(StreamCfg(), 2112, 7168), (StreamCfg(264, 512, 32, True), 2112, 7168),
                                     (StreamCfg(132, 256, 32), 4608, 7168), (StreamCfg(528, 1024, 8), 1536, 128),
                                     (StreamCfg(132, 256, 32, rows=8), 4608, 7168)])
def test_stream_sass_holds_pre_loads_across_the_wait(cfg, n, k):
    need_cutlass()
    if ec.nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed (dev extra nvidia-cuda-nvdisasm)")
    sass = bound.sass_for_arch(cfg, n, k)
    before, after = _loads_around_wait(sass)
    per = cfg.per(n, k)
    assert before == min(cfg.pre, per)
    assert after == per - min(cfg.pre, per) + 1  # the rest of the weight, then x's word
    assert sass.count("ACQBULK") == 1
    assert "STL" not in sass and "LDL" not in sass


def test_idle_and_no_pdl_kernels_compile():
    need_cutlass()
    ptx = bound.compile_for_arch(None, 0, 0, pdl=True)
    assert ptx.count("griddepcontrol.wait") == 1 and "griddepcontrol.launch_dependents" in ptx
    assert "griddepcontrol" not in bound.compile_for_arch(None, 0, 0, pdl=False)
    ptx = bound.compile_for_arch(StreamCfg(132, 256, 0, False, False), 1536, 128)
    assert "griddepcontrol" not in ptx and ptx.count("ld.global.nc") >= 1
    assert "shfl.sync.bfly" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [None, StreamCfg(), StreamCfg(264, 1024, 32, True), StreamCfg(132, 256, 0, False, False),
                                 StreamCfg(rows=8), StreamCfg(264, 256, 8, True, rows=8)])
def test_gpu_outputs(cfg):
    if not ec.available():
        pytest.skip("needs a cc >= 9.0 GPU and the CuTe DSL")
    # rows 1: N * K / 16 = 63017 words of 16 bytes, odd: a tail load the mask failed to drop would
    # XOR the last word in an odd number of times (the grid's threads are a multiple of 32).
    # rows 8: 4800 tiles of 8 rows x 64 bytes over 2112 warps x 3 loads, the rest clamped to the
    # last tile and masked (an unmasked one would XOR it in again)
    n, k = (1537, 656) if cfg is None or cfg.rows == 1 else (1536, 1600)
    w = torch.randint(-2**31, 2**31 - 1, (n, k // 4), device="cuda", dtype=torch.int32).view(torch.uint8)
    x = torch.randint(0, 255, (4, k), device="cuda", dtype=torch.uint8)
    out = torch.full((bound.out_words(cfg),), 0x5A5A5A5A, device="cuda", dtype=torch.int32)
    bound.get_kernel(cfg, n, k, cfg is None or cfg.pdl)(x, w, out)
    torch.cuda.synchronize()
    assert int(out[-1]) == int(x[0, :4].contiguous().view(torch.int32)[0])
    if cfg is not None:
        ref = w.view(torch.int32).flatten().cpu().numpy()
        import numpy as np

        assert np.bitwise_xor.reduce(out[:-1].cpu().numpy()) == np.bitwise_xor.reduce(ref)
