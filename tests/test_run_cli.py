"""`planner run` end to end on CPU: 2 gloo ranks with --check, exit codes, JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from executors import backends
from executors.backends import registry
from planner.cli import main

PLANS = Path(__file__).resolve().parent.parent / "plans"


def test_run_check_two_ranks_sp_tail(capsys):
    rc = main(["run", str(PLANS / "k3_sp_tail.yaml"), "--set", "tp_size=2", "--set", "hidden=32",
               "--world-size", "2", "--check", "--num-tokens", "11", "--seed", "5"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "2 rank(s) on cpu, num_tokens=11" in out
    for name in ("final_full", "aux2_full", "aux46_full", "aux90_full"):
        line = next(ln for ln in out.splitlines() if ln.startswith(name))
        assert "[11, 32]" in line and "exact" in line and line.rstrip().endswith("yes")
    assert "result: OK (4 outputs x 2 rank(s))" in out


def test_run_check_two_ranks_tp8_json(capsys):
    rc = main(["run", str(PLANS / "k3_tp8.yaml"), "--set", "tp_size=2", "--set", "num_layers=8", "--set", "hidden=64",
               "--set", "kda_heads=8", "--set", "head_dim=4", "--set", "fa_rank=8", "--world-size", "2", "--check",
               "--num-tokens", "5", "--emit", "json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["ok"] and len(data["ranks"]) == 2
    assert all(set(r["variants"].values()) == {"packed"} for r in data["ranks"])
    assert {o["name"] for o in data["ranks"][0]["outputs"]} == {"final_full", "aux2_full", "aux4_full", "aux5_full"}


def test_run_invalid_input_exits_2(capsys):
    assert main(["run", str(PLANS / "k3_sp_tail.yaml"), "--world-size", "2", "--check"]) == 2
    assert "has size 8 but --world-size is 2" in capsys.readouterr().err
    assert main(["run", str(PLANS / "k3_kda_projection.yaml"), "--num-tokens", "17"]) == 2
    assert main(["run", str(PLANS / "k3_kda_projection.yaml"), "--set", "nope=1"]) == 2


def test_run_mismatch_exits_1(capsys, monkeypatch):
    # a wrong gemm kernel in the priority list: the compiled run picks it, the reference (torch) does not
    def bad(op, bctx):
        return lambda ins, b, out: (ins[0] @ ins[1].t()) + 1

    def bad_chain(op, bctx):  # the packed variant's fused gemm_chain op (fuse-gemm-chains)
        return lambda ins, b, out: [(ins[0] @ ins[1].t()) + 1, torch.zeros(ins[0].shape[0], ins[2].shape[0])]

    backends.backends_for("gemm")  # load the real backends first, so the patch is not overwritten
    monkeypatch.setitem(registry._REGISTRY, ("gemm", "cute"),
                        registry.Impl("gemm", "cute", bad, lambda op, specs, device: None))
    monkeypatch.setitem(registry._REGISTRY, ("gemm_chain", "cute"),
                        registry.Impl("gemm_chain", "cute", bad_chain, lambda op, specs, device: None))
    rc = main(["run", str(PLANS / "k3_kda_projection.yaml"), "--check", "--num-tokens", "3"])
    out = capsys.readouterr().out
    assert rc == 1 and "result: MISMATCH" in out and " NO" in out


def test_run_sets_any_dim(tmp_path, capsys):
    """--dim NAME=V fixes any dim (a variant gated on a second dim can be run on purpose); an
    unknown dim, a malformed value or one outside the range exits 2 with a message."""
    p = tmp_path / "two_dims.yaml"
    p.write_text(
        "plan: two_dims\nparams: {hidden: 16}\ndims: {num_tokens: 1..64, num_seqs: 1..64}\n"
        "inputs: {x: 'bf16[num_tokens, hidden]', s: 'bf16[num_seqs, hidden]'}\n"
        "weights: {w: 'bf16[hidden, hidden]'}\noutputs: [y, z]\nops:\n"
        "  - y: gemm(x, w)\n"
        "  - region: r\n    outputs: [z]\n    variants:\n"
        "      - name: few_seqs\n        when: num_seqs <= 4\n        ops:\n          - z: gemm(s, w)\n"
        "      - name: many_seqs\n        ops:\n          - z: gemm(s, w)\n")
    assert main(["run", str(p), "--check", "--dim", "num_seqs=3", "--num-tokens", "5", "--emit", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    r0 = data["ranks"][0]
    assert r0["variants"] == {"r": "few_seqs"}
    assert {o["name"]: o["shape"] for o in r0["outputs"]} == {"y": [5, 16], "z": [3, 16]}
    for bad, words in ((["--dim", "num_sqs=3"], "did you mean 'num_seqs'"), (["--dim", "num_seqs=x"], "NAME=INTEGER"),
                       (["--dim", "num_seqs=100"], "--dim num_seqs 100 is outside 1..64"),
                       (["--num-tokens", "100"], "--num-tokens 100 is outside 1..64"),
                       (["--dim", "num_tokens=4", "--num-tokens", "5"], "disagree")):
        assert main(["run", str(p), *bad]) == 2
        err = capsys.readouterr().err
        assert words in err, err


def test_run_on_cuda_without_cuda_is_an_input_error(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    assert main(["run", str(PLANS / "k3_sp_tail.yaml"), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda: CUDA is not available here" in err and "Traceback" not in err


def test_run_takes_the_tuning_files_backends_and_checks_against_torch(tmp_path, capsys):
    """--tuning F reaches the executor whole (its backends, not only its limits); the reference
    it is checked against takes the limits but stays on torch."""
    from planner.cli import main as cli
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: p\ndims:\n  num_tokens: 1..8\ninputs:\n  x: bf16[num_tokens, 64]\nweights:\n"
                    "  w: bf16[32, 64]\noutputs: [y]\nops:\n  - y: gemm(x, w)\n")
    t = tmp_path / "t.json"
    t.write_text(json.dumps({"device": "x", "date": "2026", "torch": "2", "limits": {}, "measured": {},
                             "variants": {}, "backends": {"gemm:bf16:M=8,N=32,K=64": {"backend": "torch",
                                                                                        "config": None}}}))
    assert cli(["run", str(plan), "--tuning", str(t), "--check", "--num-tokens", "5", "--emit", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] and rep["ranks"][0]["backends"] == ["tuned:torch"], rep["ranks"][0]


def test_a_mismatch_on_some_ranks_names_the_outputs_and_the_ranks():
    import argparse

    from executors.tools.commands import _table
    out = {"name": "y", "shape": [2, 4], "dtype": "bfloat16", "max_abs_err": 0.0, "ok": True, "exact": True}

    def rep(rank, bad):
        return {"plan": "p", "rank": rank, "dims": {"num_tokens": 2}, "passes": [], "backends": ["torch"],
                "variants": {}, "outputs": [out], "ok": not bad,
                "checked": [{"forced": None, "ok": True, "bad": []},
                            {"forced": {"r": "b"}, "ok": not bad, "bad": bad}]}
    args = argparse.Namespace(device="cpu", seed=0, check=True)
    text = _table([rep(0, []), rep(1, ["y"]), rep(2, ["y"])], 3, args)
    assert "forced r=b: MISMATCH in y (rank 1, 2)" in text, text
    text = _table([rep(0, ["y"]), rep(1, ["y"])], 2, args)
    assert "forced r=b: MISMATCH in y\n" in text + "\n", text


REPLICATED = """
plan: replicated
dims:
  num_tokens: 1..16
groups:
  tp: 2
inputs:
  x: bf16[num_tokens, 32]
weights:
  w: bf16[16, 32]
outputs: [y]
ops:
  - region: r
    outputs: [y]
    variants:
      - name: gather_first
        when: num_tokens <= 4
        ops:
          - y: gemm(all_gather(x, tp), w)
      - name: gemm_first
        ops:
          - y: all_gather(gemm(x, w), tp)
"""


def test_run_same_weights_lets_variants_that_need_a_replicated_weight_agree(tmp_path, capsys):
    # the two variants are equal only when every rank holds the same w
    p = tmp_path / "replicated.yaml"
    p.write_text(REPLICATED)
    args = ["run", str(p), "--world-size", "2", "--check", "--num-tokens", "3"]
    assert main(args) == 1
    assert "MISMATCH" in capsys.readouterr().out
    assert main(args + ["--same-weights"]) == 0
    out = capsys.readouterr().out
    assert "the same weights on every rank" in out and "result: OK" in out


def test_compile_does_not_write_its_report_over_the_plan(tmp_path, capsys):
    import shutil
    from pathlib import Path as _P

    from planner.cli import main as _main
    p = tmp_path / "p.yaml"
    shutil.copy(_P(__file__).resolve().parent.parent / "plans" / "k3_sp_tail.yaml", p)
    before = p.read_text()
    assert _main(["compile", str(p), "-o", str(p)]) == 2
    assert "is the plan file itself" in capsys.readouterr().err and p.read_text() == before


def test_a_single_rank_run_is_given_up_after_its_timeout():
    """--timeout bounded only multi-rank runs; one rank ran on. Run as a user runs it, in a fresh
    process (the run here takes seconds; the limit is 0.05 s)."""
    import subprocess
    import sys
    from pathlib import Path as _P
    root = _P(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-m", "planner.cli", "run", str(root / "plans" / "k3_tp8.yaml"),
                        "--set", "hidden=256", "--set", "kda_heads=16", "--set", "head_dim=32", "--set",
                        "fa_rank=32", "--set", "num_layers=60", "--set", "tp_size=1", "--check",
                        "--num-tokens", "8", "--timeout", "0.05"], capture_output=True, text=True, cwd=root,
                       timeout=300)
    assert r.returncode == 1 and "Timeout: no result within 0.05s" in r.stdout, (r.stdout[-2000:], r.stderr[-2000:])
