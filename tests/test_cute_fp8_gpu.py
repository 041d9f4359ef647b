"""The fp8 kernel on a GPU (marker ``gpu``): M = 1..16 on several shapes and all scale kinds
against an fp32 reference of the dequantized operands, poisoned outputs, strided views, fp32
output, sweep candidates, the timeline, graph replay."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from executors.cute import fp8
from executors.cute.fp8 import BLOCK
from tests.cuteutil import gpu
from tests.fp8cases import SHAPES


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


def _check_call(m, n, k, kinds, seed, out_dtype, tag, rel_tol, config=None):
    """gemm_fp8 with its default config (or `config`) on fresh operands of these scale kinds,
    into a poisoned out of out_dtype, against the fp32 reference."""
    x, w, sa, sb = _gpu_operands(m, n, k, *kinds, seed=seed)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
    fp8.gemm_fp8(x, w, sa, sb, out, config=config)
    torch.cuda.synchronize()
    _check_gpu(out, fp8.dequant_reference(x, w, sa, sb), tag, rel_tol)


GPU_SHAPES = ["qkv_a", "q_b", "kv_b", "shared_gate_up", "shared_down", "fa_beta", "fb"]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", list(range(1, 17)))
@pytest.mark.parametrize("name", GPU_SHAPES)
def test_gpu_block_scales(name, m):
    n, k = SHAPES[name]
    _check_call(m, n, k, ("block", "block"), 1000 * m + n, torch.bfloat16, f"{name} M={m}", 6e-3)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("kinds", [("tensor", "tensor"), ("row", "col"), ("block", "tensor"),
                                   ("tensor", "block"), ("row", "block"), ("block", "col")])
def test_gpu_scale_kinds_fp32_out(kinds, m):
    n, k = 1000, 1024  # N ends in a partial 128-row block and a partial n8 tile pair
    _check_call(m, n, k, kinds, m, torch.float32, f"{kinds} M={m}", 1e-5)


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
