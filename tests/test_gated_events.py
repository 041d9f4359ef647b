"""Region outputs read on other streams: the events derive-events places, what verify proves,
and an independent simulation of the GPU's ordering for every choice of variants."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gated_util import gated_plan, gated_rank, races, simulate

from executors.lowering import build_executor
from executors.tools.check import make_data, run_check
from planner import cli
from planner.config import CompileConfig
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan
from planner.verify import VerifyError, verify
from tests.dist_plans import load_text

RACE = Path(__file__).resolve().parent / "plans" / "gated_race.yaml"


def _race(**overrides):
    return compile_plan(load_plan(RACE, overrides), CompileConfig(verify_each=True))


def _one_rank(text: str) -> str:
    """The race plan on one process: tp of size 1, so the consumer is pinned to aux."""
    return text.replace("tp_size: 2", "tp_size: 1").replace("t26: shard(g4, tp)", "t26: shard(g4, tp, stream=aux)")


def test_race_shape_waits_on_the_event_of_whichever_variant_ran():
    cp = _race()
    g = cp.graph
    assert g.nodes["t26"]["stream"] == "aux"  # assign-streams put the consumer beside the all_reduce
    assert g.nodes["r1"]["stream"] == "main"
    assert set(g.nodes["t26"]["waits"]) == {"ev.r3/var0/g4", "ev.r3/var1/g4"}
    assert "ev.r3/var0/g4" in g.nodes["r3/var0/g4"]["records"]
    assert races(cp) == {}
    verify(cp)


def test_race_shape_without_the_gated_variants_event_fails_verify():
    cp = _race()
    # the schedule derive-events used to make: only the fallback's event
    cp.graph.nodes["t26"]["waits"] = ["ev.r3/var1/g4"]
    with pytest.raises(VerifyError, match="t26 on aux reads from g4 on main without an event"):
        verify(cp)
    assert simulate(cp, {"r3": "var1"}) == []
    assert any("t26 on aux reads g4 before r3/var0/g4" in p for p in simulate(cp, {"r3": "var0"}))


def test_a_side_stream_read_of_a_plan_input_needs_the_entry_wait():
    cp = _race()
    assert cp.graph.nodes["t27"]["waits"] == ["entry"]  # t27 reads the weight w2 on aux
    cp.graph.nodes["t27"]["waits"] = []
    with pytest.raises(VerifyError, match="t27 on aux reads a plan input without waiting on the call's entry"):
        verify(cp)


def test_a_pass_that_drops_an_event_is_caught_without_verify_each(tmp_path, monkeypatch, capsys):
    import planner.pipeline as pipeline
    from planner.passes.events import derive

    def lossy(cp, cfg):
        cp, changed = derive(cp, cfg)
        cp.graph.nodes["t26"]["waits"] = ["ev.r3/var1/g4"]
        return cp, changed
    monkeypatch.setattr(pipeline, "PIPELINE", [(n, lossy if n == "derive-events" else f) for n, f in pipeline.PIPELINE])
    with pytest.raises(VerifyError):
        compile_plan(load_plan(RACE), CompileConfig())
    assert cli.main(["compile", str(RACE)]) == 1
    err = capsys.readouterr().err
    assert "internal error: the compiled plan fails verification: t26 on aux reads from g4" in err


def test_build_executor_refuses_an_unverified_schedule():
    cp = _race(tp_size=1)
    # pin the consumer to aux without its event, as a broken lowering would hand it over
    cp.graph.nodes["t26"]["stream"] = "aux"
    cp.graph.nodes["t26"]["waits"] = []
    _, w = make_data(cp.plan, {"num_tokens": 4}, 0, 0, "cpu")
    with pytest.raises(VerifyError, match="t26 on aux reads from g4"):
        build_executor(cp, w, device="cpu")


def test_executor_refuses_a_wait_whose_event_was_lost():
    text = _one_rank(RACE.read_text())
    cp = compile_plan(load_text(text), CompileConfig())
    b = {"num_tokens": 4}
    inputs, w = make_data(cp.plan, b, 0, 0, "cpu")
    ex = build_executor(cp, w, device="cpu")
    ex(dims=b, **inputs)
    assert ex.last_variants == {"r3": "var0"}
    step = next(s for s in ex._steps if s.id == "r3/var0/g4")
    step.records = ()  # what a lowering bug would do: the record is gone, the wait would be a no-op
    with pytest.raises(RuntimeError, match="waits on event ev.r3/var0/g4, which this call did not record"):
        ex(dims=b, **inputs)
    ex(dims={"num_tokens": 20}, **make_data(cp.plan, {"num_tokens": 20}, 0, 0, "cpu")[0])  # var1: fine


@pytest.mark.parametrize("num_tokens", [3, 16, 17, 40])
def test_race_shape_runs_each_variant_like_the_reference(num_tokens):
    text = _one_rank(RACE.read_text()).replace("hidden: 2048", "hidden: 64")
    rep = run_check(lambda: load_text(text), num_tokens=num_tokens, seed=num_tokens,
                    every_variant=False)  # the variants differ by design: each against its gate's reference
    assert rep["ok"], rep
    assert rep["variants"] == {"r3": "var0" if num_tokens <= 16 else "var1"}


NESTED = """
plan: nested
dims:
  num_tokens: 1..64
groups:
  tp: 2
tuned:
  lim: 16
  lim2: 4
inputs:
  x: bf16[num_tokens, 16]
weights:
  w: bf16[16, 16]
outputs: [o1, o2, o3, o4]
ops:
  - region: outer
    outputs: [g4, g5]
    variants:
      - name: small
        when: num_tokens <= tuned.lim
        ops:
          - region: inner
            outputs: [h]
            variants:
              - name: tiny
                when: num_tokens <= tuned.lim2
                ops:
                  - h: gemm(x, w, stream=aux)
              - name: mid
                ops:
                  - a: gemm(x, w)
                  - h: add(a, a, stream=aux)
          - g4: copy(h)
          - g5: gemm(h, w, stream=aux)
      - name: big
        ops:
          - b: gemm(x, w, stream=aux)
          - g4: add(b, b)
          - g5: copy(b)
  - o1: shard(g4, tp, stream=aux)
  - o2: gemm(g4, w)
  - o3: all_gather(g4, tp)
  - o4: all_gather(g5, tp)
"""


def test_nested_variants_and_a_fused_bucket_of_region_outputs():
    cp = compile_plan(load_text(NESTED), CompileConfig(verify_each=True))
    assert cp.report["fuse-collectives"]["buckets"], "the two gathers of region outputs are fused"
    assert races(cp) == {}
    # every mutation that drops one cross-stream wait is caught by verify or needs none
    g = cp.graph
    for v in cp.schedule:
        for e in list(g.nodes[v]["waits"]):
            if e == "entry":
                continue
            g.nodes[v]["waits"].remove(e)
            racy = races(cp)
            try:
                verify(cp)
                caught = False
            except VerifyError:
                caught = True
            assert caught or not racy, (v, e, racy)
            g.nodes[v]["waits"].append(e)


@pytest.mark.parametrize("seed", range(16))
def test_random_gated_plans_are_race_free_for_every_variant_choice(seed):
    cp = compile_plan(load_text(gated_plan(seed, world=2)), CompileConfig(verify_each=True))
    assert races(cp) == {}
    text = gated_plan(seed)  # one rank: execute it with the gates on both sides of each limit
    for nt in (2, 6, 30):
        rep = run_check(lambda t=text: load_text(t), num_tokens=nt, seed=seed, every_variant=False)  # variants differ by design
        assert rep["ok"], rep


def test_random_gated_plans_reach_side_streams_fusion_and_nesting():
    texts = [gated_plan(s, world=2) for s in range(24)]
    cps = [compile_plan(load_text(t), CompileConfig()) for t in texts]
    assert sum(bool(cp.report["fuse-collectives"]["buckets"]) for cp in cps) >= 5
    assert sum(len(cp.plan.regions) > 2 for cp in cps) >= 3   # nested regions
    assert all(any(cp.graph.nodes[v]["stream"] == "aux" for v in cp.graph) for cp in cps)
    # gemms inside a variant, on aux, writing into the packed buffer of a fused collective
    assert sum(any("out_slot" in cp.graph.nodes[v] and cp.graph.nodes[v]["ctx"] and cp.graph.nodes[v]["stream"] == "aux"
                   for v in cp.graph) for cp in cps) >= 5


def test_random_gated_plans_on_two_gloo_ranks_match_the_reference():
    from executors.tools.ranks import run_ranks
    per_rank = run_ranks(gated_rank, 2, list(range(6)), [3, 30], timeout_s=240)
    for reps in per_rank:
        for rep in reps:
            assert rep["ok"], (rep["seed"], rep)
    assert {v for rep in per_rank[0] for v in rep["variants"].values()} >= {"v0", "v1"}


def test_verify_is_cheap_on_the_deployment_plan():
    plan = load_plan(Path(__file__).resolve().parent.parent / "plans" / "k3_tp8.yaml")
    cp = compile_plan(plan, CompileConfig())
    t = cp.report["timings_s"]
    # the final verify costs a fraction of the passes it checks (a verify that grew worse than
    # linear would cost many times them)
    assert t["verify"] < 0.6 * sum(v for k, v in t.items() if k != "verify"), t


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("num_tokens", [16, 4096])  # var0 (gated) and var1 (fallback)
def test_race_shape_on_the_gpu_has_no_wrong_call(num_tokens):
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from check_gated_race import run_calls
    wrong, worst, variant = run_calls(num_tokens, calls=100, graphed=False)
    assert variant == ("var0" if num_tokens <= 16 else "var1")
    assert wrong == 0, (wrong, worst)


@pytest.mark.parametrize(("num_tokens", "want"), [
    (2, {"outer": "small", "outer/small/inner": "tiny"}),
    (8, {"outer": "small", "outer/small/inner": "mid"}),
    (40, {"outer": "big"}),  # the inner region sits in 'small', which did not run
])
def test_last_variants_names_only_regions_whose_enclosing_variant_ran(num_tokens, want):
    text = NESTED.replace("groups:\n  tp: 2\n", "groups:\n  tp: 1\n")
    cp = compile_plan(load_text(text), CompileConfig())
    assert cp.plan.regions["outer/small/inner"].within == (("outer", "small"),)
    assert cp.plan.regions["outer"].within == ()
    b = {"num_tokens": num_tokens}
    inputs, w = make_data(cp.plan, b, 0, 0, "cpu")
    ex = build_executor(cp, w, device="cpu")
    ex(dims=b, **inputs)
    assert ex.last_variants == want
    # a variant forced inside a variant that did not run is not reported as run either
    ex.forced = {"outer/small/inner": "tiny"}
    ex(dims=b, **inputs)
    assert ex.last_variants == ({**want, "outer/small/inner": "tiny"} if want["outer"] == "small" else want)


def test_run_check_runs_a_nested_variant_inside_its_enclosing_one(tmp_path, capsys):
    """Forcing an inner region's variant forces the variants it sits in, so it runs (it was listed
    as checked at sizes where the enclosing variant did not run); where that would force a region
    two ways, the check says the variant was not reached."""
    import json

    from planner.cli import main
    p = tmp_path / "nested.yaml"
    text = NESTED.replace("groups:\n  tp: 2\n", "groups:\n  tp: 1\n")
    for body, unreached in ((text, []), (text.replace("name: big", "name: tiny"), ["outer/small/inner"])):
        p.write_text(body)
        main(["run", str(p), "--num-tokens", "40", "--check", "--emit", "json"])  # the variants differ by design
        checked = json.loads(capsys.readouterr().out)["ranks"][0]["checked"]
        tiny = next(c for c in checked if c["forced"] and c["forced"].get("outer/small/inner") == "tiny")
        assert tiny["unreached"] == unreached, tiny
        assert (tiny["variants"].get("outer/small/inner") == "tiny") == (not unreached), tiny
    main(["run", str(p), "--num-tokens", "40", "--check"])
    assert "forced outer=tiny, outer/small/inner=tiny (1 of its regions not reached at these dims):" in capsys.readouterr().out



def test_run_check_forces_no_variant_the_compile_removed(tmp_path, capsys):
    """An outer variant whose gate folds to false at these params is removed; the regions inside it
    are not forced (forcing their enclosing variant failed with KeyError: 'small')."""
    from planner.cli import main
    p = tmp_path / "fold.yaml"
    p.write_text(NESTED.replace("groups:\n  tp: 2\n", "params:\n  tp_size: 1\ngroups:\n  tp: tp_size\n")
                 .replace("when: num_tokens <= tuned.lim\n", "when: tp_size == 2\n"))
    main(["run", str(p), "--num-tokens", "40", "--check"])
    out = capsys.readouterr().out
    assert "forced outer=big: ok" in out and "inner" not in out and "Traceback" not in out, out
