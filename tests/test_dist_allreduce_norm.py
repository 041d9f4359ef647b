"""all_reduce_add_rmsnorm on gloo ranks: `planner run --check` (compiled, fused == the unfused
reference) over 2 and 4 ranks, and the fused op against the formula on every rank's inputs."""

from __future__ import annotations

import textwrap

import pytest

from planner.cli import main

PLAN = """
plan: arnorm
params:
  hidden: 64
  tp_size: 2
dims:
  num_tokens: 1..16
groups:
  tp: tp_size
inputs:
  x: bf16[num_tokens, hidden]
  res: bf16[num_tokens, hidden]
weights:
  w_o: bf16[hidden, hidden]
  n1: bf16[hidden]
  w_up: bf16[hidden, hidden]
  n2: bf16[hidden]
  n3: bf16[hidden]
outputs: [out, res2, direct, res3]
ops:
  # o_proj's all_reduce into the post-attention norm; the MLP's into the next one (in place)
  - o: gemm(x, w_o)
  - o_ar: all_reduce(o, tp)
  - m, res1: add_rmsnorm(o_ar, res, n1, eps='1e-5')
  - up: gemm(m, w_up)
  - up_ar: all_reduce(up, tp)
  - out, res2: add_rmsnorm(res1, up_ar, n2, inplace=true)
  # the op written directly
  - direct, res3: all_reduce_add_rmsnorm(up, res, n3, tp)
"""


@pytest.mark.parametrize("world", [2, 4])
def test_run_check_fused_plan_on_gloo_ranks(tmp_path, capsys, world):
    p = tmp_path / "arnorm.yaml"
    p.write_text(textwrap.dedent(PLAN).lstrip())
    rc = main(["run", str(p), "--set", f"tp_size={world}", "--world-size", str(world), "--check",
               "--num-tokens", "7", "--seed", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "fuse-allreduce-norm" in out
    for name in ("out", "res2", "direct", "res3"):
        line = next(ln for ln in out.splitlines() if ln.startswith(name + " "))
        assert "[7, 64]" in line and line.rstrip().endswith("yes"), line
    assert f"result: OK (4 outputs x {world} rank(s))" in out


def test_fused_op_matches_the_formula_on_every_rank():
    world = 2
    from dist_allreduce_norm import fused_vs_formula

    from executors.tools.ranks import run_ranks
    reps = run_ranks(fused_vs_formula, world, 5, timeout_s=180)
    for rank, rep in enumerate(reps):
        assert rep["kinds"] == ["all_reduce_add_rmsnorm"] and rep["backend"] == "torch", rep
        assert rep["normed_err"] <= 2e-2 * max(1.0, rep["scale"]), (rank, rep)
        assert rep["r_out_err"] <= 1e-2 * max(1.0, rep["r_scale"]), (rank, rep)
