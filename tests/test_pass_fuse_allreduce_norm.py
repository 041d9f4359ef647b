"""fuse-allreduce-norm: all_reduce -> add_rmsnorm becomes one all_reduce_add_rmsnorm, and only then."""


import pytest

from planner.config import CompileConfig
from planner.report import to_json, to_text
from planner.shapes import fmt_shape
from planner.tuning import fusion_key, validate_tuning
from planner.viz import to_dot
from tests.planutil import compiled, error, ops_by_kind

NAME = "fuse-allreduce-norm"
H = """
plan: t
params:
  hidden: 64
  tp_size: 2
dims:
  num_tokens: 1..16
groups:
  tp: tp_size
  dp: 2
inputs:
  x: bf16[num_tokens, hidden]
  y: bf16[num_tokens, hidden]
  res: bf16[num_tokens, hidden]
  x32: fp32[num_tokens, hidden]
  res32: fp32[num_tokens, hidden]
weights:
  n: bf16[hidden]
  n32: fp32[hidden]
  w_o: bf16[hidden, hidden]
"""
PATTERN = """
outputs: [m, res1]
ops:
  - o: gemm(x, w_o)
  - o_ar: all_reduce(o, tp)
  - m, res1: add_rmsnorm(o_ar, res, n, eps='1e-5')
"""


def kinds(cp):
    return {k: sorted(v) for k, v in ops_by_kind(cp).items()}


def refusals(cp):
    return {e["ops"][0]: e["reason"] for e in cp.report[NAME]["not_fused"]}


def test_fuses_the_pattern_into_one_op(tmp_path):
    before = compiled(tmp_path, PATTERN, H, cfg=CompileConfig(verify_each=True, disable_passes={NAME}))
    assert kinds(before) == {"gemm": ["o"], "all_reduce": ["o_ar"], "add_rmsnorm": ["m"]}
    assert before.report[NAME] == "disabled"
    cp = compiled(tmp_path, PATTERN, H)
    assert kinds(cp) == {"gemm": ["o"], "all_reduce_add_rmsnorm": ["m"]}
    op = cp.graph.nodes["m"]["op"]
    assert (op.x, op.residual, op.w, op.group, op.eps, op.inplace) == ("o", "res", "n", "tp", 1e-5, False)
    assert op.fused_from == ["o_ar", "m"] and op.out == ["m", "res1"]
    assert "o_ar" not in cp.tensors  # the reduced sum is never materialized
    assert [(fmt_shape(cp.tensors[t].shape), cp.tensors[t].dtype) for t in op.out] == [("[num_tokens, 64]", "bf16")] * 2
    assert list(cp.graph.predecessors("m")) == ["o"] and cp.graph.nodes["m"]["stream"] == "main"
    [f] = cp.report[NAME]["fused"]
    assert (f["all_reduce"], f["add_rmsnorm"], f["group"], f["dtype"], f["removed"]) == ("o_ar", "m", "tp", "bf16", "o_ar")
    text = to_text(cp, CompileConfig())
    assert "All-reduce + norm fusion: 1 fused" in text
    assert "m: all_reduce o_ar + add_rmsnorm m -> all_reduce_add_rmsnorm over 'tp' (bf16)" in text
    data = to_json(cp, CompileConfig())
    assert data["allreduce_norm_fusion"]["fused"][0]["id"] == "m"
    assert any(o["id"] == "m" and o["fused_from"] == ["o_ar", "m"] for o in data["ops"])
    dot, _ = to_dot(cp)
    assert "fused ×2" in dot and "absorbed: o_ar, m" in dot


def test_all_reduce_as_the_residual_operand_and_inplace(tmp_path):
    cp = compiled(tmp_path, """
outputs: [out, r2]
ops:
  - h: add(x, res)
  - o: gemm(y, w_o)
  - o_ar: all_reduce(o, tp)
  - out, r2: add_rmsnorm(h, o_ar, n, inplace=true)
""", H)
    op = cp.graph.nodes["out"]["op"]
    assert op.op == "all_reduce_add_rmsnorm" and (op.x, op.residual, op.inplace) == ("o", "h", True)
    normed, new_res = (cp.tensors[t] for t in op.out)
    assert normed.alias_of is None  # a new tensor: the sum it would overwrite does not exist
    assert new_res.alias_of == "h" and new_res.meta.get("inplace")


def test_refuses_other_readers_views_and_plan_outputs(tmp_path):
    cp = compiled(tmp_path, """
outputs: [m, res1, m2, r2, a_ar, m3, r3]
ops:
  - a_ar: all_reduce(x, tp)
  - m, res1: add_rmsnorm(a_ar, res, n)
  - b_ar: all_reduce(y, tp)
  - also: add(b_ar, res)
  - m2, r2: add_rmsnorm(b_ar, also, n)
  - c_ar: all_reduce(gemm(x, w_o), tp)
  - c_rows: c_ar[:num_tokens]
  - m3, r3: add_rmsnorm(c_rows, res, n)
""", H)
    assert "all_reduce_add_rmsnorm" not in ops_by_kind(cp)
    why = refusals(cp)
    assert why["a_ar"] == "its result 'a_ar' is a plan output"
    assert why["b_ar"] == "its result 'b_ar' has 2 readers (also, m2), not one add_rmsnorm"
    assert "feeds a view" in why["c_ar"]
    text = to_text(cp, CompileConfig())
    assert "not fused: b_ar: its result 'b_ar' has 2 readers" in text


def test_refuses_different_groups_fp32_and_other_reductions(tmp_path):
    cp = compiled(tmp_path, """
outputs: [m, r, m32, r32, mx, rx, ma, ra]
ops:
  - a_ar: all_reduce(x, tp)
  - b_ar: all_reduce(y, dp)
  - m, r: add_rmsnorm(a_ar, b_ar, n)
  - f_ar: all_reduce(x32, tp)
  - m32, r32: add_rmsnorm(f_ar, res32, n32)
  - x_max: all_reduce(x, tp, reduce=max)
  - mx, rx: add_rmsnorm(x_max, res, n)
  - x_avg: all_reduce(y, tp, reduce=avg)
  - ma, ra: add_rmsnorm(x_avg, res, n)
""", H)
    assert "all_reduce_add_rmsnorm" not in ops_by_kind(cp)
    why = refusals(cp)
    assert "reduced over group dp, to a sum over tp" in why["a_ar"]
    assert "reduced over group tp, to a sum over dp" in why["b_ar"]
    assert why["f_ar"] == "fp32: the fused kernels take bf16 or fp16"
    assert why["x_max"] == "reduce=max: the fused kernels sum"
    assert why["x_avg"] == "reduce=avg: the fused kernels sum"


def test_same_group_both_operands_fuses_the_x_one_and_says_why_not_the_other(tmp_path):
    cp = compiled(tmp_path, """
outputs: [m, r]
ops:
  - a_ar: all_reduce(x, tp)
  - b_ar: all_reduce(y, tp)
  - m, r: add_rmsnorm(b_ar, a_ar, n)
""", H)
    op = cp.graph.nodes["m"]["op"]
    assert op.op == "all_reduce_add_rmsnorm" and op.fused_from == ["b_ar", "m"] and op.residual == "a_ar"
    assert refusals(cp) == {"a_ar": "add_rmsnorm 'm' already absorbs its other operand's all_reduce"}
    assert kinds(cp)["all_reduce"] == ["a_ar"]


def test_refuses_across_variants_and_explicit_norm_backends(tmp_path):
    cp = compiled(tmp_path, """
outputs: [m, r, m2, r2]
ops:
  - a_ar: all_reduce(x, tp)
  - region: norm
    outputs: [m, r]
    variants:
      - name: small
        when: num_tokens <= 4 and capturing
        ops:
          - m, r: add_rmsnorm(a_ar, res, n)
      - name: big
        ops:
          - m, r: add_rmsnorm(a_ar, res, n, eps='1e-5')
  - b_ar: all_reduce(y, tp)
  - m2, r2: add_rmsnorm(b_ar, res, n, backend=torch)
""", H)
    assert "all_reduce_add_rmsnorm" not in ops_by_kind(cp)
    why = refusals(cp)
    assert "2 readers" in why["a_ar"]
    assert why["b_ar"] == "add_rmsnorm 'm2' names backend torch: left as written"


def test_a_collective_bucket_does_not_take_the_fused_op(tmp_path):
    cp = compiled(tmp_path, """
outputs: [m, r, g1, g2]
ops:
  - a_ar: all_reduce(x, tp)
  - m, r: add_rmsnorm(a_ar, res, n)
  - g1: all_reduce(y, tp)
  - g2: all_reduce(res, tp)
""", H)
    assert kinds(cp)["all_reduce_add_rmsnorm"] == ["m"]
    [b] = cp.report["fuse-collectives"]["buckets"]
    assert b["members"] == ["g1", "g2"]


def test_dsv3_decode_plan_fuses_every_layer():
    from planner.lang.loader import load_plan
    from planner.pipeline import compile_plan
    from tests.planutil import PLANS
    cp = compile_plan(load_plan(PLANS / "dsv3_decode_tp8.yaml", {"num_layers": 5}))
    fused = cp.report[NAME]["fused"]
    # per layer: the o_proj all_reduce into the post-attention norm, the MLP/MoE one into the next
    # layer's input norm (the last into the final norm)
    assert len(fused) == 10 and not cp.report[NAME]["not_fused"]
    assert "all_reduce" not in ops_by_kind(cp)


def test_the_op_written_directly_is_checked(tmp_path):
    e = error(tmp_path, """
outputs: [m, r]
ops:
  - m, r: all_reduce_add_rmsnorm(x=x, residual=x32, w=n, group=tp)
""", H)
    assert "dtype mismatch" in str(e) and "x32" in str(e)
    e = error(tmp_path, """
outputs: [m, r]
ops:
  - m, r: all_reduce_add_rmsnorm(x=x, residual=res, w=n, group=tq)
""", H)
    assert "unknown group 'tq'" in str(e)


def test_tuning_fusion_entries_are_validated():
    k = fusion_key("bf16", 7168, 8)
    assert k == "all_reduce_add_rmsnorm:bf16:N=7168,W=8"
    assert validate_tuning({"fusion": {k: {"max_tokens": 64, "max_bytes": 64 * 7168 * 2}}})
    for bad, msg in [({"nope": {"max_tokens": 1}}, "must look like"),
                     ({k: {"max_bytes": 1}}, "must be {"),
                     ({k: {"max_tokens": -1}}, "non-negative integer"),
                     ({k: {"max_tokens": 1, "extra": 2}}, "must be {")]:
        with pytest.raises(ValueError, match=msg):
            validate_tuning({"fusion": bad})
