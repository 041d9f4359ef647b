"""Property test: random DAG plans. After every pass verify() holds, and executing the compiled
plan (fusion, two streams, events, packed slots) on the CPU gives the unfused reference result."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executors.tools.check import run_check
from planner.config import CompileConfig
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan
from tests.dist_plans import random_plan

SEEN = {"aux": 0, "fused": 0, "slots": 0, "runs": 0}


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(seed=st.integers(0, 10**6), n_ops=st.integers(4, 16))
def test_random_plans_verify_and_match_reference(tmp_path_factory, seed, n_ops):
    path = tmp_path_factory.mktemp("rand") / "p.yaml"
    path.write_text(random_plan(seed, 1, n_ops))
    cfg = CompileConfig(verify_each=True)  # verify() after every pass
    cp = compile_plan(load_plan(path), cfg)
    SEEN["runs"] += 1
    SEEN["aux"] += any(cp.graph.nodes[v]["stream"] != "main" for v in cp.graph)
    SEEN["fused"] += bool(cp.report["fuse-collectives"]["buckets"])
    SEEN["slots"] += any("out_slot" in cp.graph.nodes[v] for v in cp.graph)
    report = run_check(lambda: load_plan(path), seed=seed, config=CompileConfig(verify_each=True))
    assert report["ok"], report


def test_random_plans_exercised_streams_fusion_and_slots():
    # runs after the property test in file order: the generator must reach every mechanism
    assert SEEN["runs"] >= 20, SEEN
    assert SEEN["aux"] > 0 and SEEN["fused"] > 0 and SEEN["slots"] > 0, SEEN
