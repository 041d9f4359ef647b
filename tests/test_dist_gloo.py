"""Multi-process gloo runs: compiled == reference on 2 and 4 ranks; mismatched plans refused, no hang."""

from __future__ import annotations

import pytest
from dist_plans import mismatched, random_plan, shipped_and_random, wrong_group_size

from executors.tools.ranks import RankFailure, run_ranks

N_RANDOM = 12


def _check_reports(per_rank):
    for rank, reports in enumerate(per_rank):
        for rep in reports:
            assert rep["rank"] == rank
            assert rep["ok"], (rep["plan"], rep.get("why"), rep["outputs"], rep.get("text"))


@pytest.mark.parametrize("world", [2, 4])
def test_shipped_and_random_plans_match_reference(world):
    texts = [random_plan(1000 * world + i, world) for i in range(N_RANDOM)]
    per_rank = run_ranks(shipped_and_random, world, texts, 13, timeout_s=240)
    _check_reports(per_rank)
    for reports in per_rank:
        sp = reports[0]
        assert sp["plan"] == "k3_sp_tail" and sp["independent_ok"]
        assert len(sp["fused"]) == 1, sp["fused"]  # four gathers became one
        assert all(o["exact"] and o["max_abs_err"] == 0.0 for o in sp["outputs"])
        tp8 = reports[1]
        assert tp8["plan"] == "k3_tp8" and not any(o["exact"] for o in tp8["outputs"])
    # the random set exercised exact data movement and allclose arithmetic both
    kinds = {o["exact"] for rep in per_rank[0][2:] for o in rep["outputs"]}
    assert kinds == {True, False}


@pytest.mark.parametrize("world,differ", [(2, 1), (4, 2)])
def test_rank_with_a_different_plan_is_refused_on_every_rank(world, differ):
    with pytest.raises(RankFailure) as info:
        run_ranks(mismatched, world, differ, timeout_s=90, coll_timeout_s=20)
    errs = info.value.errors
    assert sorted(errs) == list(range(world)), errs  # every rank refused, none hung or ran
    for rank, (kind, msg) in errs.items():
        assert kind == "PlanMismatch", (rank, kind, msg)
        assert f"ranks [{differ}]" in msg and "different plan" in msg


def test_group_size_mismatch_is_a_clear_error_on_every_rank():
    with pytest.raises(RankFailure) as info:
        run_ranks(wrong_group_size, 2, timeout_s=90, coll_timeout_s=20)
    errs = info.value.errors
    assert sorted(errs) == [0, 1]
    assert all(k == "GroupError" and "has size 4 but the process group bound to it has 2" in m for k, m in errs.values())
