"""GPU-only: every backend of the new ops that can run here agrees with the fp32 reference
(poisoned outputs; executors.tools.tune_ops.time_op's check), and the small DeepSeek-V3 plan
runs compiled == reference on the GPU."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _ops():
    from planner.ops import Gemm, Quantize
    from planner.ops_pointwise import AddRmsNorm, GeluAndMul, RmsNorm, Rope, SiluAndMul
    from planner.shapes import TensorSpec as T
    m, h = 16, 7168
    return [
        (RmsNorm(op="rmsnorm", id="y", x="x", w="w", out=["y"]), [T("x", (m, h), "bf16"), T("w", (h,), "bf16")]),
        (AddRmsNorm(op="add_rmsnorm", id="y", x="x", residual="r", w="w", out=["y", "r2"]),
         [T("x", (m, h), "bf16"), T("r", (m, h), "bf16"), T("w", (h,), "bf16")]),
        (SiluAndMul(op="silu_and_mul", id="y", x="x", out=["y"]), [T("x", (m, 4608), "bf16")]),
        (GeluAndMul(op="gelu_and_mul", id="y", x="x", out=["y"]), [T("x", (m, 4608), "bf16")]),
        (Rope(op="rope", id="q", q="q", k="k", positions="p", cos_sin_cache="c", interleave=True, out=["q2", "k2"]),
         [T("q", (m, 16, 64), "bf16"), T("k", (m, 64), "bf16"), T("p", (m,), "int64"), T("c", (4096, 64), "fp32")]),
        (Quantize(op="quantize", id="q", x="x", out=["q", "s"]), [T("x", (m, h), "bf16")]),
        (Gemm(op="gemm", id="y", a="a", b="b", scale_a="sa", scale_b="sb", out=["y"]),
         [T("a", (m, h), "fp8_e4m3"), T("b", (2112, h), "fp8_e4m3"), T("sa", (m, 56), "fp32"),
          T("sb", (17, 56), "fp32")]),
        (Gemm(op="gemm", id="y", a="a", b="b", scale_a="sa", scale_b="sb", out=["y"]),
         [T("a", (m, h), "fp8_e4m3"), T("b", (2112, h), "fp8_e4m3"), T("sa", (1,), "fp32"), T("sb", (1,), "fp32")]),
    ]


@pytest.mark.parametrize("i", range(8))
def test_every_backend_here_matches_the_reference(i):
    from executors.tools.tune_ops import op_candidates, time_op
    op, specs = _ops()[i]
    cands = op_candidates(op, specs, "cuda")
    times = time_op(op, specs, {}, cands, iters=2, trials=1, nsets=2)
    assert all(us is not None for us in times.values()), (op.op, times)


def test_small_dsv3_plan_on_gpu():
    from executors.tools.check import run_check
    from planner.lang.loader import load_plan
    from tests.test_dsv3_plan import PLAN, SMALL
    rep = run_check(lambda: load_plan(PLAN, {**SMALL, "tp_size": 1}), num_tokens=5, device="cuda")
    assert rep["ok"], rep["outputs"]
