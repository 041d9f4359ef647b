"""fuse-gemm-chains: gemm -> split/slice -> gemm on a column range becomes one gemm_chain op."""

import pytest
import torch

from executors.lowering import build_executor
from executors.tools.check import make_data
from planner.config import CompileConfig
from planner.pipeline import compile_plan
from tests.planutil import PLANS, compiled, load, ops_by_kind

HEADER = """
plan: t
dims:
  num_tokens: 1..16
inputs:
  x: bf16[num_tokens, 64]
weights:
  w: bf16[96, 64]
  wb: bf16[16, 32]
  wc: bf16[16, 16]
"""

CHAIN = """
outputs: [q, g]
ops:
  - p: gemm(x, w)
  - q, fa: split(p, [64, 32])
  - g: gemm(fa, wb)
"""


def test_chain_becomes_one_op_and_pass_can_be_disabled(tmp_path):
    before = compiled(tmp_path, CHAIN, HEADER, CompileConfig(verify_each=True, disable_passes={"fuse-gemm-chains"}))
    after = compiled(tmp_path, CHAIN, HEADER)
    assert sorted(ops_by_kind(before)) == ["gemm", "split"] and len(ops_by_kind(before)["gemm"]) == 2
    assert ops_by_kind(after) == {"gemm_chain": ["p"], "split": ["q"]}
    op = after.op("p")
    assert (op.a, op.b, op.b2, op.col, op.width, op.out, op.fused_from) == ("x", "w", "wb", 64, 32, ["p", "g"], ["p", "g"])
    assert after.tensors["g"].producer == "p" and after.tensors["g"].shape[1] == 16
    assert before.tensors["g"].producer == "g"  # the loaded plan's specs are left alone
    assert after.report["fuse-gemm-chains"]["fused"] == [{"id": "p", "fused_from": ["p", "g"], "col": 64, "width": 32,
                                                          "stream": None}]
    assert before.report["fuse-gemm-chains"] == "disabled"
    # a slice works like a split piece
    sliced = compiled(tmp_path, """
outputs: [g]
ops:
  - p: gemm(x, w)
  - fa: slice(p, dim=1, start=32, stop=64)
  - g: gemm(fa, wb)
""", HEADER)
    assert sliced.op("p").op == "gemm_chain" and sliced.op("p").col == 32


@pytest.mark.parametrize("body, reason", [
    ("  - q, fa: split(p, [80, 16])\n  - g: gemm(fa, wc)\n", "width of 32..512"),
    ("  - q, fa: split(p, [60, 36])\n  - g: gemm(fa, wd)\n", "col % 8 == 0"),
    ("  - q, fa: split(p, [64, 32])\n  - g: gemm(fa, wb, backend=torch)\n", "backend torch"),
    ("  - q, fa: split(p, [64, 32])\n  - wt: copy(wb)\n  - g: gemm(fa, wt)\n", "not a plan weight"),
])
def test_chains_the_kernel_cannot_run_stay_two_gemms(tmp_path, body, reason):
    header = HEADER + "  wd: bf16[16, 36]\n"
    cp = compiled(tmp_path, "outputs: [q, g]\nops:\n  - p: gemm(x, w)\n" + body, header)
    assert "gemm_chain" not in ops_by_kind(cp)
    (skip,) = cp.report["fuse-gemm-chains"]["not_fused"]
    assert skip["ops"] == ["p", "g"] and reason in skip["reason"], skip


def test_fused_op_runs_on_cpu_like_the_two_gemms(tmp_path):
    plan = load(tmp_path, CHAIN, HEADER)
    inputs, w = make_data(plan, {"num_tokens": 5}, seed=1, rank=0, device="cpu")
    fused = build_executor(compile_plan(plan), w, device="cpu")
    plain = build_executor(compile_plan(plan, CompileConfig(disable_passes={"fuse-gemm-chains"})), w, device="cpu")
    assert fused.backends["p"] == "torch" and "g" not in fused.backends
    a, b = fused(**inputs), plain(**inputs)
    for k in ("q", "g"):
        torch.testing.assert_close(a[k], b[k])


def test_kda_packed_variant_is_fused_two_branch_is_not():
    from planner.lang.loader import load_plan
    cp = compile_plan(load_plan(PLANS / "k3_kda_projection.yaml"))
    kinds = {v: cp.op(v).op for v in cp.graph.nodes}
    assert kinds["kda_projection.0/packed/proj"] == "gemm_chain" and "kda_projection.0/packed/g1" not in kinds
    op = cp.op("kda_projection.0/packed/proj")
    assert (op.b, op.b2, op.col, op.width) == ("w_packed", "w_fb", 6144, 128)
    # two_branch: the first gemm reads a slice of the packed weight, not a whole weight
    assert kinds["kda_projection.0/two_branch/g1"] == "gemm"
    (skip,) = cp.report["fuse-gemm-chains"]["not_fused"]
    assert "not a plan weight" in skip["reason"]
