"""Weights prepared once (executors.weights): the mma_a layout, which weights take it, every
path reading the one prepared tensor (both variants, eager and compiled, CPU), in-place
preparation and loading new weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from executors import build_executor
from executors.tools.check import compile_for_run
from executors.weights import (
    MMA_A,
    ROW,
    _chain_first_weights,
    _only_gemm_weight_reads,
    choose_layouts,
    from_layout,
    load_weights,
    mma_a_matmul,
    prepare_weights,
    to_layout,
)
from planner.lang.loader import load_plan

ROOT = Path(__file__).resolve().parent.parent
KDA = ROOT / "plans" / "k3_kda_projection.yaml"
# fab_pad 8: 512 + 48 = 560 rows, both row slices on 16-row tile boundaries
SMALL = {"hidden": 256, "kda_heads": 64, "head_dim": 16, "fa_rank": 32, "fab_pad": 8}


def _weights(plan, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {n: (torch.randn(plan.tensors[n].shape, generator=g) / 16).bfloat16() for n in plan.weights}


def test_mma_a_layout_is_the_kernels_tile_order_and_inverts():
    from executors import cute
    w = torch.randn(48, 96).bfloat16()
    p = to_layout(w, MMA_A)
    assert torch.equal(p, cute.tile_weights(w, 2)) and p.shape == w.shape
    assert torch.equal(from_layout(p, MMA_A), w)
    assert torch.equal(to_layout(w[16:48], MMA_A), p[16:48])  # a 16-row slice is the layout of its rows
    x = torch.randn(5, 96)
    torch.testing.assert_close(mma_a_matmul(x, p.float()), x @ w.float().t(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="N % 16 == 0"):
        to_layout(torch.zeros(24, 64), MMA_A)


def test_which_weights_take_the_layout():
    cp = compile_for_run(load_plan(KDA))
    assert _chain_first_weights(cp) == {"w_packed"}
    assert _only_gemm_weight_reads(cp, "w_packed")     # the packed gemm and the two 16-row slices
    assert choose_layouts(cp, "cpu") == {"w_packed": ROW, "w_fb": ROW}   # no fused kernel on CPU
    odd = compile_for_run(load_plan(KDA, {**SMALL, "fab_pad": 4}))        # fab slice starts at 512, 44 rows
    assert not _only_gemm_weight_reads(odd, "w_packed")


@pytest.fixture(scope="module")
def pair():
    plan = load_plan(KDA, SMALL)
    w = _weights(plan)
    row = build_executor(compile_for_run(plan), w, device="cpu")
    cp = compile_for_run(plan)
    pw = prepare_weights(cp, w, "cpu", layouts={"w_packed": MMA_A})
    tiled = build_executor(cp, pw, device="cpu")
    return plan, w, pw, row, tiled


@pytest.mark.parametrize("capturing", [False, True])
def test_every_path_reads_the_prepared_tensor(pair, capturing):
    """Both variants (packed; two_branch through row slices of the tiled tensor) on the mma_a
    weight equal the row-major executor; the executor holds the prepared tensor only."""
    plan, w, pw, row, tiled = pair
    assert tiled.weight_layouts == {"w_packed": MMA_A, "w_fb": ROW} and tiled.prepacked_bytes == {}
    assert tiled._weights["w_packed"].data_ptr() == pw["w_packed"].data_ptr() != w["w_packed"].data_ptr()
    assert tiled.backends["kda_projection.0/packed/proj"] == "torch"  # the gemm_chain op, on the tile view
    assert tiled.backends["kda_projection.0/two_branch/fab_out"] == "torch:mma_a"
    for m in (1, 7, 16):
        x = torch.randn(m, 256).bfloat16()
        tiled.tuned["kda_two_branch_max"] = row.tuned["kda_two_branch_max"] = 16
        a = tiled(x=x, _facts=tiled.facts({"x": x}, capturing=capturing))
        b = row(x=x, _facts=row.facts({"x": x}, capturing=capturing))
        assert tiled.last_variants == row.last_variants == {
            "kda_projection.0": "two_branch" if capturing else "packed"}
        for k in a:
            torch.testing.assert_close(a[k].float(), b[k].float(), rtol=1e-2, atol=1e-2)


def test_compiled_op_on_prepared_weights_equals_eager(pair):
    _, _, _, _, tiled = pair
    tiled.tuned["kda_two_branch_max"] = 2
    f = torch.compile(lambda x: tiled(x=x), fullgraph=True, dynamic=True)
    for m in (3, 5):
        x = torch.randn(m, 256).bfloat16()
        want, got = tiled(x=x), f(x)
        assert all(torch.equal(want[k], got[k]) for k in want)


def test_inplace_preparation_and_load_weights_keep_one_copy_at_fixed_addresses():
    plan = load_plan(KDA, SMALL)
    w = _weights(plan, 1)
    orig = w["w_packed"].clone()
    cp = compile_for_run(plan)
    pw = prepare_weights(cp, w, "cpu", layouts={"w_packed": MMA_A}, inplace=True)
    assert pw["w_packed"] is w["w_packed"] and torch.equal(from_layout(w["w_packed"], MMA_A), orig)
    ex = build_executor(cp, pw, device="cpu")
    ref = build_executor(compile_for_run(plan), {"w_packed": orig, "w_fb": w["w_fb"]}, device="cpu")
    x = torch.randn(4, 256).bfloat16()
    assert all(torch.allclose(a.float(), b.float(), atol=1e-2) for a, b in zip(ex(x=x).values(), ref(x=x).values(), strict=True))
    new = _weights(plan, 2)
    ptr = ex._weights["w_packed"].data_ptr()
    load_weights(ex, new)
    assert ex._weights["w_packed"].data_ptr() == ptr
    fresh = build_executor(compile_for_run(plan), new, device="cpu")
    for k, v in fresh(x=x).items():
        torch.testing.assert_close(ex(x=x)[k].float(), v.float(), rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="weight 'w_fb' must be bf16"):
        load_weights(ex, {"w_fb": torch.zeros(3, 3)})
    with pytest.raises(KeyError, match="no weight 'w_nope'"):
        load_weights(ex, {"w_nope": torch.zeros(3, 3)})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_one_copy_of_the_weights_and_the_fused_kernel_reads_it():
    """Executors for 3 KDA layers, weights prepared in place: memory_allocated beyond the weights'
    bytes <= 1 %; the fused kernel runs on the mma_a tensor and matches an fp32 reference."""
    from executors import cute
    if not cute.available():
        pytest.skip("cutlass DSL not available")
    plan = load_plan(KDA)
    torch.cuda.current_blas_handle()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    ws = [{k: v.cuda() for k, v in _weights(plan, s).items()} for s in range(3)]
    wbytes = torch.cuda.memory_allocated() - base
    exs = []
    for w in ws:
        cp = compile_for_run(plan)
        exs.append(build_executor(cp, prepare_weights(cp, w, "cuda", inplace=True), device="cuda"))
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - base - wbytes <= 0.01 * wbytes
    ex, w = exs[0], ws[0]
    assert ex.weight_layouts["w_packed"] == MMA_A and ex.backends["kda_projection.0/packed/proj"] == "cute"
    row = from_layout(w["w_packed"], MMA_A).float()
    hc, fa = plan.params["head_cols"], plan.params["fa_rank"]
    for m in (1, 8, 16):
        x = torch.randn(m, 7168, device="cuda").bfloat16()
        out = ex(x=x)
        proj = x.float() @ row.t()
        torch.testing.assert_close(out["mixed_qkv"].float(), proj[:, :3 * hc], rtol=2e-2, atol=2e-2)
        g1 = proj[:, 4 * hc:4 * hc + fa].bfloat16().float() @ w["w_fb"].float().t()
        torch.testing.assert_close(out["g1"].float(), g1, rtol=2e-2, atol=2e-2)
