"""Random mutations of the shipped plans: load or fail with a located PlanError; never crash."""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import PlanError
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan
from tests.fuzz_util import mutate
from tests.planutil import PLANS

SOURCES = {p: p.read_text() for p in [PLANS / "k3_kda_projection.yaml", PLANS / "k3_sp_tail.yaml",
                                        PLANS / "k3_tp8.yaml"]}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(which=st.integers(0, len(SOURCES) - 1), seed=st.integers(0, 2**32 - 1), n=st.integers(1, 4))
def test_mutants_never_crash(which, seed, n):
    path = list(SOURCES)[which]
    text = mutate(SOURCES[path], random.Random(seed), n)
    try:
        plan = load_plan(path, text=text)
        compile_plan(plan)
    except PlanError as err:
        assert err.diagnostics, "a PlanError must carry a diagnostic"
        for d in err.diagnostics:
            assert d.loc is not None and d.loc.line >= 1, d.format()
            assert d.message


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(text=st.text(max_size=300))
def test_arbitrary_text_never_crashes(tmp_path_factory, text):
    p = tmp_path_factory.mktemp("fz") / "p.yaml"
    p.write_text(text)
    try:
        load_plan(p)
    except PlanError:
        pass
