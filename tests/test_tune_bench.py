"""CPU tests of `planner tune` / `planner bench` support: the tuning-file format, limit
derivation, that `planner compile --tuning` changes limits and cost numbers, and that
apply_tuning rewires gemm steps without changing results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from executors import build_executor
from executors.tools.bench import close_report, md_table, parse_tokens, write_report
from executors.tools.check import make_data
from executors.tools.tune import (
    ForcedGate,
    apply_tuning,
    derive_limit,
    gemm_runner,
    limit_gates,
    load_tuning,
    new_tuning,
    parse_signature,
    plan_gemms,
    save_tuning,
    tuned_executor,
    validate_tuning,
)
from planner.cli import main
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan

PLANS = Path(__file__).resolve().parent.parent / "plans"
KDA = PLANS / "k3_kda_projection.yaml"
SMALL = {"hidden": 64, "kda_heads": 8, "head_dim": 4, "fa_rank": 8}   # tp 8: qkvg 16, fab 13, head_cols 4


# ------------------------------------------------------------------ file format

def _sample() -> dict:
    t = new_tuning("NVIDIA H200", "2.11.0", date="2026-11-30T02:00:00+00:00")
    t["limits"] = {"kda_two_branch_max": 8}
    t["backends"] = {"gemm:bf16:M=8,N=6144,K=7168": {"backend": "cute", "config": {"kind": "stream", "m_tile": 8}},
                     "gemm:bf16:M=16,N=6144,K=7168": {"backend": "torch", "config": None}}
    t["measured"] = {"gemm:bf16:M=8,N=6144,K=7168": 22.9, "gemm:bf16:M=16,N=6144,K=7168": 24.5}
    t["variants"] = {"kda_projection.0": {"8": {"two_branch": 25.0, "packed": 26.0}}}
    return t


def test_tuning_round_trip(tmp_path):
    t = _sample()
    p = save_tuning(t, tmp_path / "sub" / "tuning.json")
    back = load_tuning(p)
    assert back == t
    assert list(json.loads(p.read_text()))[:7] == ["device", "date", "torch", "limits", "backends", "measured",
                                                     "variants"]
    assert load_tuning(back) is back  # a dict passes through


@pytest.mark.parametrize("bad, word", [
    ({"limits": {"x": -1}}, "limits.x"),
    ({"limits": {"x": 1.5}}, "limits.x"),
    ({"limits": {"x": True}}, "limits.x"),
    ({"measured": {"s": "fast"}}, "measured"),
    ({"backends": {"s": "torch"}}, "backends"),
    ({"backends": {"s": {"backend": "cute", "config": 3}}}, "config"),
    ({"limits": []}, "'limits' must be an object"),
    ([], "JSON object"),
])
def test_tuning_validation_names_the_key(bad, word):
    with pytest.raises(ValueError, match=word.replace("[", r"\[").replace(".", r"\.")):
        validate_tuning(bad)


def test_parse_signature():
    assert parse_signature("gemm:bf16:M=8,N=6144,K=7168") == ("bf16", 8, 6144, 7168)
    assert parse_signature("all_gather:bf16[4x7168]") is None


# ------------------------------------------------------------------ limits

def test_derive_limit_from_synthetic_measurements():
    v, f = "two_branch", "packed"
    t = {1: {v: 25.0, f: 27.0}, 2: {v: 25.1, f: 27.1}, 4: {v: 25.2, f: 27.0}, 8: {v: 25.4, f: 27.2},
         12: {v: 28.0, f: 27.3}, 16: {v: 26.0, f: 27.4}}
    assert derive_limit(t, v, f) == 8            # loses at 12: 16's win does not count
    assert derive_limit({str(k): x for k, x in t.items()}, v, f) == 8   # JSON keys are strings
    assert derive_limit({1: {v: 30.0, f: 27.0}, 2: {v: 1.0, f: 27.0}}, v, f) == 0
    all_win = {b: {v: 1.0, f: 2.0} for b in (1, 2, 4, 16)}
    assert derive_limit(all_win, v, f) == 16
    assert derive_limit({1: {v: 26.0, f: 27.0}}, v, f, min_gain=0.05) == 0   # 3.7% < 5%
    assert derive_limit({1: {v: 26.0, f: 27.0}, 2: {f: 27.0}}, v, f) == 1    # missing time stops the scan
    assert derive_limit({1: {v: 27.0, f: 27.0}}, v, f) == 0                  # a tie is no win


def test_limit_gates_found_from_plan():
    plan = load_plan(KDA)
    assert limit_gates(plan) == {"kda_two_branch_max": ("kda_projection.0", "two_branch", "packed")}


def test_plan_gemm_signatures_cover_both_variants():
    plan = load_plan(KDA)
    cp = compile_plan(plan)
    sigs = plan_gemms(cp, "num_tokens", [1, 8, 16])
    for m in (1, 8, 16):
        for n, k in ((6144, 7168), (144, 7168), (1536, 128), (6288, 7168)):
            assert f"gemm:bf16:M={m},N={n},K={k}" in sigs
    assert len(sigs) == 12


# ------------------------------------------------------------------ compile --tuning

def _compile_json(capsys, *extra):
    assert main(["compile", str(KDA), "--emit", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_compile_tuning_changes_limit_and_costs(tmp_path, capsys):
    base = _compile_json(capsys, "--device-name", "none")  # the plan default, not the shipped H200 tuning
    tb = lambda d: [r for r in d["critical_path"] if r["variant"] == "two_branch"]  # noqa: E731
    assert [r["bindings"]["num_tokens"] for r in tb(base)] == [1, 2]          # plan default limit 2
    t = new_tuning()
    t["limits"] = {"kda_two_branch_max": 12}
    f = tmp_path / "t.json"
    save_tuning(t, f)
    tuned = _compile_json(capsys, "--tuning", str(f))
    assert max(r["bindings"]["num_tokens"] for r in tb(tuned)) == 12           # gate limit moved
    # measured times replace the model's estimate for those op signatures
    t["measured"] = {f"gemm:bf16:M={m},N=6288,K=7168": 100.0 for m in (1, 2, 4, 8, 12, 16)}
    t["measured"].update({f"gemm:bf16:M={m},N=1536,K=128": 1.0 for m in (1, 2, 4, 8, 12, 16)})
    save_tuning(t, f)
    measured = _compile_json(capsys, "--tuning", str(f))
    packed = {r["bindings"]["num_tokens"]: r["serial_us"] for r in measured["critical_path"] if r["variant"] == "packed"}
    assert all(abs(v - 101.0) < 1e-6 for v in packed.values()), packed
    before = {r["bindings"]["num_tokens"]: r["serial_us"] for r in base["critical_path"] if r["variant"] == "packed"}
    assert packed != before


# ------------------------------------------------------------------ executor hook

def _small_exec(tuning=None):
    plan = load_plan(KDA, dict(SMALL))
    cp = compile_plan(plan)
    _, w = make_data(plan, {"num_tokens": 4}, seed=1, rank=0, device="cpu")
    return plan, cp, w


def test_gemm_runner_torch_into_column_slice():
    a = torch.randn(3, 16)
    w = torch.randn(5, 16)
    buf = torch.full((3, 9), float("nan"))
    r = gemm_runner("torch", None, torch.float32)(a, w, buf[:, 2:7])
    assert torch.allclose(buf[:, 2:7], a @ w.t(), atol=1e-5) and torch.allclose(r, a @ w.t(), atol=1e-5)
    with pytest.raises(ValueError, match="unknown gemm backend"):
        gemm_runner("nope")


def test_apply_tuning_rewires_gemms_and_keeps_results():
    plan, cp, w = _small_exec()
    x = torch.randn(4, 64).to(torch.bfloat16)
    want = build_executor(cp, w, device="cpu")(x=x)
    t = new_tuning()
    t["backends"] = {f"gemm:bf16:M={m},N={n},K={k}": {"backend": "torch", "config": None}
                     for m in (1, 2, 4, 8, 12, 16) for n, k in ((16, 64), (13, 64), (4, 8), (29, 64))}
    t["limits"] = {"kda_two_branch_max": 8}
    ex = tuned_executor(compile_plan(load_plan(KDA, dict(SMALL))), w, t, device="cpu")
    gemms = [s for s in ex._steps if s.kind == "gemm"]
    assert gemms and all(ex.backends[s.id] == "tuned:torch" for s in gemms)
    assert ex.tuned["kda_two_branch_max"] == 8
    got = ex(x=x)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert apply_tuning(ex, t) == len(gemms)   # idempotent
    assert torch.equal(ex(x=x)["g1"], want["g1"])
    # M above every tuned M uses the original runner; no backends -> nothing rewired
    t2 = dict(t, backends={"gemm:bf16:M=1,N=16,K=64": {"backend": "torch", "config": None}})
    ex2 = tuned_executor(compile_plan(load_plan(KDA, dict(SMALL))), w, t2, device="cpu")
    assert torch.equal(ex2(x=x)["mixed_qkv"], want["mixed_qkv"])
    assert apply_tuning(ex2, new_tuning()) == 0


def test_forced_gate_picks_the_variant():
    plan, cp, w = _small_exec()
    ex = build_executor(cp, w, device="cpu")
    x = torch.randn(2, 64).to(torch.bfloat16)
    ref = ex(x=x)
    assert ex.last_variants["kda_projection.0"] == "packed"      # not capturing
    ex._gates["kda_projection.0"] = ForcedGate("kda_projection.0", "two_branch", ["two_branch", "packed"])
    got = ex(x=x)
    assert ex.last_variants["kda_projection.0"] == "two_branch"
    ok, errs = close_report(got, ref)
    assert ok, errs


# ------------------------------------------------------------------ CLI and report helpers

def test_tune_and_bench_registered_and_need_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["tune", str(KDA)]) == 2
    assert main(["bench", str(KDA), "--tokens", "1,2"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert main(["tune", str(PLANS / "missing.yaml")]) == 2
    capsys.readouterr()
    assert main(["bench", str(KDA), "--emit", "json"]) == 2   # the error is JSON too
    assert "needs a CUDA GPU" in json.loads(capsys.readouterr().out)["errors"][0]["message"]


def test_report_helpers(tmp_path):
    assert parse_tokens("1,2,4..6", []) == [1, 2, 4, 5, 6]
    assert parse_tokens(None, [8, 1]) == [8, 1]
    rows = [{"tokens": 8, "a": 1.234, "ok": True}, {"tokens": 16, "a": None, "ok": False}]
    cols = [("tokens", "tokens", ""), ("a", "a (us)", ".2f"), ("ok", "check", "")]
    t = md_table(rows, cols)
    assert "| 8 | 1.23 | True |" in t and "| 16 | - | False |" in t
    write_report(tmp_path, "x", {"device": "cpu"}, rows, cols, "title")
    assert json.loads((tmp_path / "x.json").read_text())["rows"][0]["tokens"] == 8
    assert (tmp_path / "x.csv").read_text().splitlines()[0] == "tokens,a,ok"
    assert (tmp_path / "x.md").read_text().startswith("# title")


def test_tune_plan_dry_run_on_cpu(tmp_path):
    """The whole tuner on CPU (eager timing, torch only): signatures, variants, limits, file."""
    from executors.tools.tune import tune_plan
    lines = []
    res = tune_plan(str(KDA), dict(SMALL), buckets=[1, 2, 4], iters=2, trials=1, nsets=2, device="cpu",
                    log=lines.append)
    assert len(res["backends"]) == 12 and all(e["backend"] == "torch" for e in res["backends"].values())
    assert set(res["measured"]) == set(res["backends"])
    v = res["variants"]["kda_projection.0"]
    assert sorted(v, key=int) == ["1", "2", "4"] and all(set(x) == {"two_branch", "packed"} for x in v.values())
    assert res["limits"]["kda_two_branch_max"] == derive_limit(v, "two_branch", "packed")
    assert sum(ln.startswith("[tune] (") for ln in lines) == 12       # a progress line per op/bucket
    assert any(ln.startswith("[tune] variants") for ln in lines)
    back = load_tuning(save_tuning(res, tmp_path / "t.json"))
    ex = tuned_executor(compile_plan(load_plan(KDA, dict(SMALL))), _small_exec()[2], back, device="cpu")
    assert ex.tuned["kda_two_branch_max"] == res["limits"]["kda_two_branch_max"]


@pytest.mark.parametrize("plan, ov, world", [
    (KDA, SMALL, 1),
    (PLANS / "k3_sp_tail.yaml", {"tp_size": 2, "hidden": 32}, 2),
])
def test_bench_plan_dry_run_on_cpu(plan, ov, world):
    from executors.tools.bench import bench_plan
    res = bench_plan(str(plan), dict(ov), [1, 5], world=world, iters=2, trials=1, nsets=2, device="cpu")
    assert [r["tokens"] for r in res["rows"]] == [1, 5]
    assert all(r["ok"] and r["compiled_us"] > 0 and r["reference_us"] > 0 for r in res["rows"])


def test_variant_refinement_mechanics_on_cpu():
    """A second choice per gemm is tried end to end per variant and recorded (kept or reverted)."""
    from executors.tools.tune import time_variants
    load = lambda: load_plan(KDA, dict(SMALL))  # noqa: E731
    t = new_tuning()
    t["backends"] = {f"gemm:bf16:M={m},N={n},K={k}": {"backend": "torch", "config": None}
                     for m in (1, 2) for n, k in ((16, 64), (13, 64), (4, 8), (29, 64))}
    alts = {sig: ("torch", None) for sig in t["backends"]}
    lines = []
    out = time_variants(compile_plan, load, t, "num_tokens", [1, 2], iters=2, trials=1, nsets=2, dev="cpu",
                        alternatives=alts, log=lines.append)
    assert set(out["kda_projection.0"]) == {"1", "2"}
    # two_branch has 3 gemm signatures, packed 2, per bucket
    assert len(t["refinements"]) == 2 * (3 + 2)
    assert all(r["to"]["backend"] == "torch" for r in t["refinements"])
    assert all(e["backend"] == "torch" for e in t["backends"].values())
    validate_tuning(t)


def test_variant_times_are_the_worse_bucket_end(monkeypatch):
    """A bucket serves M = previous bucket + 1 .. bucket: each variant is timed at both ends and
    the slower counts (cuBLAS picked a split-K F_A kernel at M = 13..15 that did not overlap the
    QKVG kernel, while M = 16 was fine)."""
    import executors.tools.tune as tune
    assert tune.bucket_probes([1, 2, 4, 8, 12, 16]) == [
        (1, [1]), (2, [2]), (4, [3, 4]), (8, [5, 8]), (12, [9, 12]), (16, [13, 16])]
    assert tune.bucket_probes([8, 16], lo=4) == [(8, [4, 8]), (16, [9, 16])]

    def fake_time_graphs(fns, **kw):  # us = the M the step ran at (+1 for packed), from its outputs
        out = {}
        for n, f in fns.items():
            m = next(iter(f(0).values())).shape[0]
            out[n] = float(m) + (1.0 if n == "packed" else 0.0) + (20.0 if m == 2 else 0.0)
        return out

    monkeypatch.setattr(tune, "time_graphs", fake_time_graphs)
    load = lambda: load_plan(KDA, dict(SMALL))  # noqa: E731
    lines = []
    out = tune.time_variants(compile_plan, load, new_tuning(), "num_tokens", [1, 4], iters=1, trials=1,
                             nsets=1, dev="cpu", log=lines.append)
    v = out["kda_projection.0"]
    assert v["1"] == {"two_branch": 1.0, "packed": 2.0}
    assert v["4"] == {"two_branch": 22.0, "packed": 23.0}  # M = 2 (the low end) is the slow one
    assert any("num_tokens=4 ends 2:" in ln and "; 4:" in ln for ln in lines)


def test_tune_plan_times_only_the_variants_the_params_leave(tmp_path):
    """At tp_size 4 dce removes KDA's two_branch variant (its gate says tp_size == 8): the tuner
    times the variants the compiled plan has instead of forcing one the executor does not have."""
    from executors.tools.tune import tune_plan
    res = tune_plan(str(KDA), {**SMALL, "tp_size": 4}, buckets=[1, 2], iters=2, trials=1, nsets=2, device="cpu",
                    variants=True, log=lambda _: None)
    v = res["variants"]["kda_projection.0"]
    assert sorted(v, key=int) == ["1", "2"] and all(set(x) == {"packed"} for x in v.values())
    assert res["limits"]["kda_two_branch_max"] == 0
    load_tuning(save_tuning(res, tmp_path / "t.json"))


@pytest.mark.parametrize("argv, says", [
    (["bench", str(KDA), "--tokens", "abc"], "--tokens 'abc': expected sizes of num_tokens"),
    (["bench", str(KDA), "--tokens", "8..1"], "--tokens '8..1': expected sizes"),
    (["bench", str(KDA), "--tokens", "1,99"], "--tokens: 99 is outside num_tokens's range 1..16"),
    # checked before the range is built: 10**10 sizes were a list first, and a MemoryError
    (["bench", str(KDA), "--tokens", "1..10000000000"], "--tokens: 10000000000 is outside num_tokens's range"),
    (["tune", str(KDA), "--buckets=-5..3"], "--buckets: -5 is outside num_tokens's range 1..16"),
    (["bench", str(KDA), "--world-size", "0"], "--world-size must be at least 1"),
    (["bench", str(PLANS / "k3_sp_tail.yaml"), "--world-size", "3"], "has size 8 but --world-size is 3"),
    (["bench", str(KDA), "--tuning", "{missing}"], "cannot read the tuning file"),
    (["bench", str(KDA), "--tuning", "{other}"], "limits.x: plan 'k3_kda_projection' declares no tuned limit"),
    (["tune", str(KDA), "--dim", "tokens"], "--dim tokens: plan 'k3_kda_projection' has no dim 'tokens'"),
    (["tune", str(KDA), "--buckets", "1,x"], "--buckets '1,x': expected sizes"),
    (["tune", str(KDA), "--buckets", "0,4"], "--buckets: 0 is outside num_tokens's range 1..16"),
])
def test_tune_and_bench_arguments_checked_before_the_gpu(tmp_path, capsys, argv, says):
    """Bad arguments are located errors with exit 2 where they are read, GPU or not: on a GPU a
    malformed --tokens was a ValueError traceback and a bad --tuning failed inside the run."""
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"limits": {"x": 1}}))
    argv = [a.format(missing=tmp_path / "missing.json", other=other) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "error[" in err and "GPU" not in err


def test_a_range_of_more_sizes_than_can_be_timed_is_refused_before_it_is_built(tmp_path, capsys):
    """A dim of 1..10**10 allows --tokens 1..10**10, which was built as a list (a MemoryError)."""
    import shutil
    shutil.copytree(KDA.parent / "lib", tmp_path / "lib")  # the plan's include
    p = tmp_path / "big.yaml"
    p.write_text(KDA.read_text().replace("range: 1..16, buckets: [1, 2, 4, 8, 12, 16]", "range: 1..10000000000, buckets: [1, 16, 10000000000]"))
    for argv in (["bench", str(p), "--tokens", "1..10000000000"], ["tune", str(p), "--buckets", "8,1..70000"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "sizes; at most 65,536 (each is a run)" in err and "Traceback" not in err, err
