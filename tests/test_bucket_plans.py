"""Decisions per bucket: measured model-code times per size, and a stream plan of its own for a
range of the dim where another assignment beats the single choice (assign-streams ->
plan-buckets -> the executor picks the range's plan per call; `run --check` runs each)."""


import json

import pytest
import torch

from planner.config import CompileConfig
from planner.cost import DeviceProfile, op_signature
from planner.report import to_json, to_text
from planner.verify import VerifyError, verify
from tests.planutil import compiled, load

# after h: a chain p -> q (model code, then a GEMM) and two independent model-code ops r and s.
# Where s is short, {p, q} beside {r, s} balances best; where s is long, s alone beside the rest.
HEADER = """
plan: fork
params: {hidden: 64}
dims: {num_tokens: 1..64}
inputs:
  x: bf16[num_tokens, hidden]
weights:
  w: bf16[hidden, hidden]
  w2: bf16[hidden, hidden]
"""
BODY = """
outputs: [q, r, s]
ops:
  - h: gemm(x, w)
  - p: extern(fp, h, shape=[num_tokens, hidden], cost_us=3)
  - q: gemm(p, w2)
  - r: extern(fr, h, shape=[num_tokens, hidden], cost_us=3)
  - s: extern(fs, h, shape=[num_tokens, hidden], cost_us=3)
"""
COST = {"fp": 10.0, "fr": 10.0, "fs": 10.0}
LONG_S = {16: 30.0}  # s is the long pole at 9..16 tokens only


def measured(tmp_path, long_s=LONG_S) -> dict:
    """A tuning's "measured" times of every extern site at every bucket."""
    cp = compiled(tmp_path, BODY, HEADER)
    out = {}
    for b in cp.plan.dims["num_tokens"].buckets:
        bind = {**cp.plan.params, "num_tokens": b}
        for v in cp.schedule:
            op = cp.op(v)
            if op.op == "extern":
                sig = op_signature(op, [cp.tensors[n] for n in op.inputs()], bind, [cp.tensors[n] for n in op.out])
                out[sig] = long_s.get(b, COST[op.fn]) if op.fn == "fs" else COST[op.fn]
    return out


def with_times(tmp_path, times, **kw):
    prof = DeviceProfile()
    prof.measured = times
    return compiled(tmp_path, BODY, HEADER, CompileConfig(profile=prof, verify_each=True, **kw))


def aux_ops(streams: dict) -> list:
    return sorted(v for v, s in streams.items() if s != "main" and v in ("p", "q", "r", "s"))


def test_extern_signature_names_the_function_and_shapes(tmp_path):
    cp = compiled(tmp_path, BODY, HEADER)
    op = cp.op("p")
    sig = op_signature(op, [cp.tensors["h"]], {"num_tokens": 16, "hidden": 64}, [cp.tensors["p"]])
    assert sig == "extern:fp:M=16,bf16[16x64]->bf16[16x64]"


def test_measured_extern_time_replaces_cost_us(tmp_path):
    from planner.cost import CostModel
    times = measured(tmp_path)
    prof = DeviceProfile()
    prof.measured = times
    cp = compiled(tmp_path, BODY, HEADER)
    m = CostModel(prof, {})
    assert m.op_us(cp.op("s"), cp.tensors, {"num_tokens": 16}) == 30.0
    assert m.op_us(cp.op("s"), cp.tensors, {"num_tokens": 32}) == 10.0
    assert CostModel(DeviceProfile(), {}).op_us(cp.op("s"), cp.tensors, {"num_tokens": 16}) == 3.0


def runs(cp, i) -> dict:
    """The op -> stream assignment range i runs (its own, or the plan's single choice)."""
    own = cp.bucket_plans[i]["streams"]
    return own if own is not None else {v: cp.graph.nodes[v]["stream"] for v in cp.graph.nodes}


def test_one_range_gets_its_own_stream_plan(tmp_path):
    cp = with_times(tmp_path, measured(tmp_path))
    plans = cp.bucket_plans
    assert [(p["lo"], p["hi"]) for p in plans] == [(1, 8), (9, 16), (17, 64)]  # contiguous, the whole range
    for i in (0, 2):  # where s is short: the branch split
        assert aux_ops(runs(cp, i)) in (["p", "q"], ["r", "s"])
    assert aux_ops(runs(cp, 1)) in (["s"], ["p", "q", "r"])  # where s is long: s alone beside the rest
    single = {v: cp.graph.nodes[v]["stream"] for v in cp.graph.nodes}
    for p in plans:
        if p["cp"] is None:
            continue
        assert p["streams"] != single
        assert all(a < b * 0.99 for a, b in zip(p["scheduled_us"], p["single_us"], strict=True))
        verify(p["cp"])  # its events are derived and proven like the plan's
        assert all(p["cp"].graph.nodes[v]["stream"] == s for v, s in p["streams"].items())
    assert sum(p["cp"] is not None for p in plans) in (1, 2)


def test_no_ranges_when_one_assignment_serves_every_size(tmp_path):
    cp = with_times(tmp_path, measured(tmp_path, long_s={}))
    assert cp.bucket_plans == []
    assert "planned per bucket" not in to_text(cp, CompileConfig())
    assert to_json(cp, CompileConfig())["bucket_plans"] == []


def test_pass_disabled_keeps_the_single_choice(tmp_path):
    cp = with_times(tmp_path, measured(tmp_path), disable_passes={"plan-buckets"})
    assert cp.bucket_plans == [] and cp.bucket_ranges  # decided by assign-streams, not made into plans
    assert "planned per bucket" not in to_text(cp, CompileConfig())
    assert to_json(cp, CompileConfig())["bucket_plans"] == []
    from executors import build_executor
    from executors.tools.check import make_data
    _, w = make_data(load(tmp_path, BODY, HEADER), {"num_tokens": 64}, seed=0, rank=0, device="cpu")
    assert build_executor(cp, w, device="cpu", externs=externs(), tuning={}).pieces == []


def test_report_and_json_name_each_range(tmp_path):
    cp = with_times(tmp_path, measured(tmp_path))
    prof = DeviceProfile()
    prof.measured = measured(tmp_path)
    text = to_text(cp, CompileConfig(profile=prof))
    assert "planned per bucket: 3 ranges of num_tokens" in text
    own = next(p for p in cp.bucket_plans if p["cp"] is not None)
    assert f"num_tokens {own['lo']}..{own['hi']}:" in text and f"its own stream plan (num_tokens {own['lo']}" in text
    assert "the best assignment differs across buckets: chose the one with the smallest worst-case loss" in text
    js = to_json(cp, CompileConfig(profile=prof))["bucket_plans"]
    assert [(p["min"], p["max"]) for p in js] == [(1, 8), (9, 16), (17, 64)]
    for p, mine in zip(js, cp.bucket_plans, strict=True):
        assert (p["streams"] is None) == (mine["cp"] is None) == (p["exit_waits"] is None)
        if mine["cp"] is not None:
            assert p["streams"] == mine["streams"]


def test_a_broken_range_plan_fails_verification(tmp_path):
    cp = with_times(tmp_path, measured(tmp_path))
    p = next(p for p in cp.bucket_plans if p["cp"] is not None)
    for v in p["cp"].schedule:  # drop every wait: the side stream's reads are no longer ordered
        p["cp"].graph.nodes[v]["waits"] = []
    with pytest.raises(VerifyError, match=rf"stream plan of num_tokens {p['lo']}\.\.{p['hi']}"):
        verify(cp)


def test_no_ranges_in_plans_with_regions(tmp_path):
    body = BODY.replace("  - h: gemm(x, w)\n", "") .replace("outputs: [q, r, s]\nops:\n", """outputs: [q, r, s]
ops:
  - region: pre
    variants:
      - name: small
        when: num_tokens <= 4
        ops:
          - h0: gemm(x, w)
      - name: big
        ops:
          - h0: gemm(x, w2)
    outputs: [h0]
  - h: add(h0, h0)
""")
    prof = DeviceProfile()
    prof.measured = measured(tmp_path)
    cp = compiled(tmp_path, body, HEADER, CompileConfig(profile=prof, verify_each=True))
    assert cp.bucket_plans == []


def externs():
    return {name: (lambda h, k=k: torch.tanh(h * k)) for k, name in enumerate(("fp", "fr", "fs"), start=1)}


def test_executor_runs_the_plan_of_the_calls_range(tmp_path):
    from executors import build_executor
    from executors.tools.check import make_data, reference_compiled
    cp = with_times(tmp_path, measured(tmp_path))
    plan = load(tmp_path, BODY, HEADER)
    _, w = make_data(plan, {"num_tokens": 64}, seed=0, rank=0, device="cpu")
    ex = build_executor(cp, w, device="cpu", externs=externs(), tuning={})
    ref = build_executor(reference_compiled(load(tmp_path, BODY, HEADER)), w, device="cpu", externs=externs(),
                         tuning={})
    assert ex.pieces == [("num_tokens", 1, 8), ("num_tokens", 9, 16), ("num_tokens", 17, 64)]
    for m, want in ((1, 0), (8, 0), (9, 1), (16, 1), (17, 2), (64, 2)):
        ins, _ = make_data(plan, {"num_tokens": m}, seed=m, rank=0, device="cpu")
        got, exp = ex(**ins), ref(**ins)
        assert ex.last_piece == want
        assert all(torch.equal(got[k], exp[k]) for k in exp)
    for i in range(3):
        assert {st.id: st.stream for st in ex._pieces[i][3]} == {v: s for v, s in runs(cp, i).items()}


def test_run_check_runs_every_range(tmp_path):
    from executors.tools.check import run_check
    prof = DeviceProfile()
    prof.measured = measured(tmp_path)
    rep = run_check(lambda: load(tmp_path, BODY, HEADER), num_tokens=16, externs=externs(),
                    config=CompileConfig(profile=prof), tuning={})
    assert rep["ok"], rep
    plans = [c.get("stream_plan") for c in rep["checked"]]
    assert plans == ["num_tokens 9..16", "num_tokens 1..8", "num_tokens 17..64"]
    assert all(c["ok"] for c in rep["checked"])


def test_ranks_agree_on_every_range_plan(tmp_path):
    from executors.collectives import first_difference, plan_description
    cp = with_times(tmp_path, measured(tmp_path))
    other = with_times(tmp_path, measured(tmp_path))
    assert plan_description(cp) == plan_description(other)
    own = next(p for p in other.bucket_plans if p["cp"] is not None)
    v = next(v for v, s in own["streams"].items() if s != "main")
    own["cp"].graph.nodes[v]["stream"] = "main"  # a rank that would run this range differently
    diff = first_difference([plan_description(cp), plan_description(other)])
    assert diff is not None and "bucket plans" in diff and f"{v} stream=" in diff


def test_planner_run_compiles_as_planner_compile_does(capsys):
    """`planner run --check` plans with the same shipped tuning as `planner compile` (the shipped
    MLA plan has per-bucket stream plans on the H200) and checks every range's plan."""
    from planner.cli import main
    from tests.planutil import PLANS
    mla = str(PLANS / "dsv3_mla_input_proj.yaml")
    assert main(["compile", mla, "--emit", "json"]) == 0
    ranges = [(p["min"], p["max"]) for p in json.loads(capsys.readouterr().out)["bucket_plans"]]
    assert len(ranges) >= 2
    assert main(["run", mla, "--check", "--num-tokens", "2"]) == 0
    out = capsys.readouterr().out
    for lo, hi in ranges:
        assert f"stream plan of num_tokens {lo}..{hi}" in out
    assert "result: OK" in out


def test_no_range_plan_for_a_near_tie_or_a_fork_that_does_not_pay(tmp_path):
    """A range's own plan must beat the single choice by 1 % and by more than two events, and a
    fork must save --min-gain-us against serial there, like the single choice."""
    cp = with_times(tmp_path, measured(tmp_path, long_s={16: 10.4}))  # s a little longer at 16: a near-tie
    assert cp.bucket_plans == []
    cp = with_times(tmp_path, measured(tmp_path), min_gain_us=100.0)  # no fork pays 100 us
    assert cp.bucket_plans == [] and cp.report["assign-streams:scopes"][0]["mode"] == "serial"


def test_an_exact_tie_gets_no_range_plan_even_at_zero_cost(tmp_path):
    """At a bucket where everything costs 0 (num_tokens 0) and events cost 0, the serial plan ties
    the single choice: a tie is not a gain, and the report never divides by a zero time."""
    head = """
plan: z
params: {hidden: 64}
dims: {num_tokens: {range: 0..64, buckets: [0, 1, 8, 64]}}
inputs:
  x: bf16[num_tokens, hidden]
weights:
  w: bf16[hidden, hidden]
  w2: bf16[hidden, hidden]
  w3: bf16[hidden, hidden]
"""
    body = "outputs: [p, r]\nops:\n  - h: gemm(x, w)\n  - p: gemm(h, w2)\n  - r: gemm(h, w3)\n"
    cfg = CompileConfig(profile=DeviceProfile(event_us=0.0), verify_each=True)
    cp = compiled(tmp_path, body, head, cfg)
    for p in cp.bucket_plans:
        if p["cp"] is not None:
            assert all(a < 0.99 * b for a, b in zip(p["scheduled_us"], p["single_us"], strict=True)), p
    to_text(cp, cfg)


def test_a_disabled_pass_leaves_no_claim_of_ranges_in_the_decision(tmp_path):
    cp = with_times(tmp_path, measured(tmp_path), disable_passes={"plan-buckets"})
    text = to_text(cp, CompileConfig())
    assert "plan-buckets" not in text.split("Streams", 1)[1].split("Schedule", 1)[0]
    assert not any(i.get("per_bucket") for i in cp.report["assign-streams:scopes"])
