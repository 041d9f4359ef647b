"""Misuse that plans written as a new user would write them ran into, and what each now gets:
located load errors (exit 2) where the plan is wrong, a one-line failure (exit 1) where the run
cannot go on, and runs that work where the plan is right."""

from __future__ import annotations

import textwrap

import pytest
import torch

from executors.tools.check import make_data, outputs_match, pick_dims, tolerance
from planner.cli import main
from tests.planutil import diagnostic, gated, load, write

H = """
plan: t
params:
  hidden: 128
  tp_size: 2
  max_pos: 4
dims:
  num_tokens: 1..8
groups:
  tp: tp_size
inputs:
  x: bf16[num_tokens, hidden]
  q: bf16[num_tokens, 2, 16]
  k: bf16[num_tokens, 16]
  pos: int64[num_tokens]
weights:
  w: bf16[64, hidden]
  nw: bf16[hidden]
  cs: fp32[max_pos, 16]
"""


def _err(tmp_path, body, header=H):
    return diagnostic(tmp_path, body, header)


def _run(tmp_path, body, *args, header=H):
    p = write(tmp_path, textwrap.dedent(header).lstrip("\n") + textwrap.dedent(body))
    return main(["run", str(p), *args])


@pytest.mark.parametrize("body, want", [
    ("outputs: [t1]\nops:\n  - t1, t2: add(x, x)\n", "add 't1': makes 1 tensor(s) but 2 output names"),
    ("outputs: [y]\nops:\n  - y, z: gemm(x, w)\n", "gemm 'y': makes 1 tensor(s) but 2"),
    ("outputs: [y]\nops:\n  - y, z: rmsnorm(x, nw)\n", "rmsnorm 'y': makes 1"),  # z unused: not dropped silently
    ("outputs: [p]\nops:\n  - p, q2: extern(f, x, shape=[num_tokens, 4])\n", "not shape="),
    ("outputs: [r]\nops:\n  - r, c: all_to_all(x, tp, splits=4)\n", "only with counts="),
])
def test_more_output_names_than_results_is_a_located_error(tmp_path, body, want):
    if "all_to_all" in body:
        body = body.replace("all_to_all(x,", "all_to_all(s,")
        header = H.replace("  pos: int64[num_tokens]\n", "  pos: int64[num_tokens]\n  s: bf16[8, hidden]\n")
    else:
        header = H
    e = _err(tmp_path, body, header)
    assert e.code == "shape" and want in e.message, e.message
    assert e.loc is not None and e.loc.line > 1


def test_add_rmsnorm_in_place_on_one_tensor_twice(tmp_path):
    body = "outputs: [y, r]\nops:\n  - h: gemm(x, w)\n  - y, r: add_rmsnorm(h, h, w[0], inplace=true)\n"
    body = body.replace("w[0]", "nw").replace("gemm(x, w)", "copy(x)")
    e = _err(tmp_path, body)
    assert "same storage" in e.message and e.code == "shape"
    # without inplace the op reads h twice and writes new tensors: fine
    plan = load(tmp_path, body.replace(", inplace=true", ""), H)
    assert plan.tensors["r"].shape == plan.tensors["h"].shape


@pytest.mark.parametrize("op", ["all_reduce(xq, tp)", "reduce_scatter(xq, tp)"])
def test_fp8_reductions_are_refused(tmp_path, op):
    body = f"outputs: [y]\nops:\n  - xq, xs: quantize(x, fp8_e4m3, block=[1, 128])\n  - y: {op}\n"
    e = _err(tmp_path, body)
    assert "cannot reduce fp8" in e.message and e.loc.line == 22, (e.message, e.loc)


@pytest.mark.parametrize("b", ["xq", "yq"])
def test_fp8_add_is_refused_where_mul_and_norms_are(tmp_path, b):
    body = (f"outputs: [y]\nops:\n  - xq, xs: quantize(x, fp8_e4m3, block=[1, 128])\n"
            f"  - yq, ys: quantize(x, fp8_e4m3, block=[1, 128])\n  - y: add(xq, {b})\n")
    e = _err(tmp_path, body)
    assert e.code == "shape" and "add of fp8_e4m3 operands" in e.message, e.message
    assert e.loc.line == 23, e.loc
    plan = load(tmp_path, body.replace(f"add(xq, {b})", "add(x, x)"), H)  # bf16 add still fine
    assert plan.tensors["y"].dtype == "bf16"


def test_fp8_all_gather_runs_as_bytes(tmp_path, capsys):
    body = "outputs: [ag, s]\nops:\n  - xq, xs: quantize(x, fp8_e4m3, block=[1, 128])\n" \
           "  - ag: all_gather(xq, tp)\n  - s: all_gather(xs, tp)\n"
    rc = _run(tmp_path, body, "--world-size", "2", "--check", "--num-tokens", "5")
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "ag      [10, 128]  float8_e4m3fn" in out and "result: OK" in out


def test_run_data_keeps_rope_positions_inside_the_cache(tmp_path, capsys):
    body = "outputs: [q2, k2]\nops:\n  - q2, k2: rope(q, k, pos, cs)\n"
    plan = load(tmp_path, body, H)
    b = pick_dims(plan, 8, 0)
    for seed in range(5):
        ins, _ = make_data(plan, b, seed, 0, "cpu")
        assert int(ins["pos"].max()) < 4
    assert _run(tmp_path, body, "--check", "--num-tokens", "8") == 0, capsys.readouterr().out


def test_weights_of_per_call_shape_are_refused(tmp_path):
    header = H.replace("  cs: fp32[max_pos, 16]\n", "  cs: fp32[max_pos, 16]\n  gw: bf16[num_tokens, 1]\n")
    e = _err(tmp_path, "outputs: [y]\nops:\n  - y: mul(x, gw)\n", header)
    assert "weight 'gw'" in e.message and "params only" in e.message and e.loc.line == 19


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_backend_that_cannot_run_here_is_one_line(tmp_path, capsys, ranks):
    body = "outputs: [y]\nops:\n  - y: rmsnorm(x, nw, backend=flashinfer)\n"
    header = H if ranks == 2 else H.replace("groups:\n  tp: tp_size\n", "")
    rc = _run(tmp_path, body, "--check", header=header)
    cap = capsys.readouterr()
    assert rc == 1
    assert "failed first: UnsupportedOp: op 'y' (rmsnorm) cannot run on cpu" in cap.out
    assert "Traceback" not in cap.out + cap.err


def test_quantize_takes_flashinfer_and_param_blocks(tmp_path):
    plan = load(tmp_path, "outputs: [y, s]\nops:\n  - y, s: quantize(x, fp8_e4m3, block=[1, hidden],"
                          " backend=flashinfer)\n", H)
    op = next(o for o in plan.ops if o.op == "quantize")
    assert op.block == [1, 128] and op.backend == "flashinfer"
    assert plan.tensors["s"].shape[1] == 1
    plan = load(tmp_path, "outputs: [y, s]\nops:\n  - y, s: quantize(x, fp8_e4m3, block=[1, hidden // 2])\n", H)
    assert plan.tensors["s"].shape[1] == 2
    e = _err(tmp_path, "outputs: [y, s]\nops:\n  - y, s: quantize(x, fp8_e4m3, block=[1, num_tokens])\n")
    assert "takes integers or expressions of params" in e.message or "unknown name" in e.message, e.message


def test_negative_eps_is_refused(tmp_path):
    e = _err(tmp_path, "outputs: [y]\nops:\n  - y: rmsnorm(x, nw, eps='-1')\n")
    assert e.code == "schema" and "greater than 0" in e.message


def test_fp8_outputs_compare_normwise_and_nans_match():
    torch.manual_seed(0)
    r = torch.randn(100, 256) * 30
    r[:, 0] = 0.01  # small entries next to large ones: elementwise fp8 error is relative to the block
    a = r + 0.04 * r.abs().mean() * torch.randn_like(r)  # about 4 % of the magnitude, like an fp8 path
    tol = tolerance(["bf16", "fp8_e4m3"])
    assert not outputs_match(a, r, tol)  # elementwise: the small entries fail
    assert outputs_match(a, r, tol, normwise=True)
    # partial mistakes a norm over the whole output would hide (a scale off by less than one e4m3
    # step, 12.5 %, passes fp8's elementwise tolerance already)
    for bad in (lambda t: t.index_fill(0, torch.tensor([99]), 0.0),       # the last token zeroed
                lambda t: torch.cat([t[:, :128] * 1.3, t[:, 128:]], 1),    # one 128-column block's scale
                lambda t: torch.cat([t[:, :240], t[:, 240:] * 1.5], 1),    # 1/16 of the columns
                lambda t: 2 * t, torch.zeros_like):
        assert not outputs_match(bad(r), r, tol, normwise=True)
    e5 = tolerance(["bf16", "fp8_e5m2"])
    assert not outputs_match(r.index_fill(0, torch.tensor([3]), 0.0), r, e5, normwise=True)
    n = torch.full((3,), float("nan"))
    assert outputs_match(n, n.clone(), tolerance(["bf16"])) and outputs_match(n, n.clone(), None)
    assert not outputs_match(torch.zeros(3), n, tolerance(["bf16"]), normwise=True)


def test_world_size_hint_names_the_plans_param(tmp_path, capsys):
    header = H.replace("  tp_size: 2\n", "  ep: 2\n").replace("tp: tp_size", "tp: ep")
    rc = _run(tmp_path, "outputs: [y]\nops:\n  - y: all_reduce(x, tp)\n", "--world-size", "3", header=header)
    err = capsys.readouterr()
    assert rc == 2 and "--set ep=3" in err.out + err.err


def test_gate_dtype_typo_lists_the_dtypes(tmp_path):
    body = gated("dtype(x) == fp8")
    e = _err(tmp_path, body)
    assert "valid: bf16" in e.message and e.hint == "did you mean 'fp8_e4m3'?"


def test_tuned_limit_in_a_dim_says_where_tuned_limits_go(tmp_path):
    header = H + "tuned:\n  cap: 4\n"
    e = _err(tmp_path, "outputs: [y]\nops:\n  - y: slice(x, 0, 0, tuned.cap)\n", header)
    assert "tuned limits are read by gates only" in e.message, e.message


def test_unknown_dtype_hint_is_its_own_line(tmp_path):
    e = _err(tmp_path, "outputs: [p, c]\nops:\n  - p, c: extern(f, x, shapes=[[num_tokens, 4], [4]],"
                        " dtypes=[bf16, in32])\n")
    assert "unknown dtype 'in32'" in e.message and "did you mean" not in e.message
    assert e.hint == "did you mean 'int32'?"
