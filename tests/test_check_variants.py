"""run --check forces every variant of every region, capture-only ones included."""

import subprocess
import sys

import pytest

pytest.importorskip("torch")

from executors.tools.check import run_check  # noqa: E402
from tests.planutil import ROOT, load, write  # noqa: E402

H = """
plan: swap
params: {hidden: 64}
dims: {num_tokens: 1..16}
inputs:
  x: bf16[num_tokens, hidden]
weights:
  w: bf16[32, hidden]
  w2: bf16[32, hidden]
"""

BODY = """
outputs: [a, b]
ops:
  - region: r
    outputs: [a, b]
    variants:
      - name: graph_only
        when: capturing and num_tokens <= 8
        ops:
          - a: gemm(x, {first})
          - b: gemm(x, {second})
      - name: plain
        ops:
          - a: gemm(x, w)
          - b: gemm(x, w2)
"""


def test_capture_only_variant_that_swaps_outputs_fails(tmp_path):
    body = BODY.format(first="w2", second="w")
    rep = run_check(lambda: load(tmp_path, body, H), num_tokens=4, seed=1)
    # on a CPU the gates pick the fallback, which is right; the forced capture-only variant is not
    assert rep["variants"] == {"r": "plain"}
    assert not rep["ok"]
    forced = {c["forced"]["r"]: c for c in rep["checked"] if c["forced"]}
    assert set(forced) == {"graph_only", "plain"}
    assert not forced["graph_only"]["ok"] and forced["graph_only"]["bad"] == ["a", "b"]
    assert forced["plain"]["ok"]
    assert "variant 'graph_only' (forced) computes something else: a, b" in rep["why"]


def test_every_variant_checked_and_listed(tmp_path):
    body = BODY.format(first="w", second="w2")
    rep = run_check(lambda: load(tmp_path, body, H), num_tokens=4, seed=1)
    assert rep["ok"]
    assert [c["forced"] for c in rep["checked"]] == [None, {"r": "graph_only"}, {"r": "plain"}]
    assert all(c["ok"] for c in rep["checked"])


def test_run_cli_lists_checked_variants_and_fails_on_the_swap(tmp_path):
    path = write(tmp_path, H + BODY.format(first="w2", second="w"))
    res = subprocess.run([sys.executable, "-m", "planner", "run", str(path), "--world-size", "1", "--check",
                          "--num-tokens", "4"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "forced r=graph_only: MISMATCH in a, b" in res.stdout
    assert "forced r=plain: ok" in res.stdout
    assert "as the gates chose: ok" in res.stdout


@pytest.mark.parametrize("plan,over", [
    ("dsv3_mla_input_proj.yaml", {"hidden": 64, "q_lora_rank": 32, "kv_lora_rank": 16, "rope_dim": 8,
                                  "heads": 4, "qk_head_dim": 16, "tp_size": 2, "max_positions": 64}),
    ("dsv3_moe_shared_expert.yaml", {"hidden": 64, "experts": 16, "tp_size": 8}),
])
def test_dsv3_plans_match_the_reference_with_model_externs(plan, over):
    from executors.tools.externs import model_externs
    from planner.lang.loader import load_plan
    from tests.planutil import PLANS
    rep = run_check(lambda: load_plan(PLANS / plan, over), num_tokens=5, seed=3, externs=model_externs())
    assert rep["ok"], rep
    assert all(o["max_abs_err"] is not None for o in rep["outputs"])
