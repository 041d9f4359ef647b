"""Ranks that would run different things are refused before the first collective, on every
rank, with the first difference named: an input dtype, a literal width, a tuned limit."""

from __future__ import annotations

import pytest
from dist_agree import every_case

from executors.collectives import first_difference, plan_description, plan_hash
from executors.tools.ranks import run_ranks
from planner.config import CompileConfig
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan
from tests.dist_agree import RACE, _race_text


@pytest.fixture(scope="module")
def cases():
    return run_ranks(every_case, 2, 1, timeout_s=180, coll_timeout_s=20)


def _refused(cases, name):
    got = [c[name] for c in cases]
    assert [k for k, _ in got] == ["refused", "refused"], got  # every rank refused, none ran on or hung
    msgs = {m.rsplit("; this is rank", 1)[0] for _, m in got}
    assert len(msgs) == 1, msgs  # the same words on every rank
    return msgs.pop()


def test_input_dtype_difference_is_named(cases):
    msg = _refused(cases, "dtype")
    assert "first difference in tensors: rank 0 has final: bf16[" in msg
    assert "rank 1 has final: fp16[" in msg


def test_literal_width_difference_is_named(cases):
    msg = _refused(cases, "width")
    assert "tensors: rank 0 has y: bf16[num_tokens, 64]" in msg and "rank 1 has y: bf16[num_tokens, 48]" in msg


def test_a_build_error_on_one_rank_is_named_on_every_rank(cases):
    msg = _refused(cases, "weight")  # the others do not wait in the agreement for a rank that raised
    assert "first difference in build errors: rank 0 has (nothing); rank 1 has weight 'w' has shape (3, 3)" in msg


def test_missing_model_code_on_one_rank_is_named_on_every_rank(cases):
    msg = _refused(cases, "extern")  # it was raised after the agreement, and the others hung in the all_reduce
    assert "first difference in build errors: rank 0 has (nothing); rank 1 has" in msg and "'act'" in msg, msg


def test_an_error_without_a_message_on_one_rank_is_named_by_its_type(cases):
    msg = _refused(cases, "silent")  # an empty message agreed with the others' empty one
    assert "first difference in build errors: rank 0 has (nothing); rank 1 has MemoryError" in msg, msg


def test_tuning_difference_is_named(cases):
    msg = _refused(cases, "tuning")
    assert "first difference in tuned limits: rank 0 has lim=16; rank 1 has lim=4" in msg


@pytest.mark.parametrize("lim", [16, 4])  # var0 and var1 on both ranks
def test_same_tuning_on_both_ranks_runs_and_checks(cases, lim):
    for c in cases:
        kind, rep = c[f"same{lim}"]
        assert kind == "ran" and rep["ok"], rep
        assert rep["variants"] == {"r3": "var0" if lim >= 8 else "var1"}


def _cp(text=None, cfg=None):
    return compile_plan(load_plan(RACE, text=text or _race_text()), cfg or CompileConfig())


def test_description_covers_config_tuning_and_backends():
    base = plan_hash(_cp())
    assert plan_hash(_cp()) == base
    assert plan_hash(_cp(cfg=CompileConfig(bucket_cap_mb=1.0))) != base
    assert plan_hash(_cp(), tuning={"lim": 3}) != base
    assert plan_hash(_cp(), tuning={"limits": {"lim": 16}, "backends": {"gemm:x": "cute"}}) != base
    assert plan_hash(_cp(), backend_prefs=("torch",)) != base
    assert plan_hash(_cp(text=_race_text().replace("y: bf16[", "y: fp16["))) != base


def test_first_difference_is_in_section_order():
    a = plan_description(_cp())
    b = plan_description(_cp(text=_race_text(48)))
    why = first_difference([a, b])
    assert why.startswith("params: rank 0 has hidden=64; rank 1 has hidden=48"), why
    assert first_difference([a, a]) is None
