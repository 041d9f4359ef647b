"""When one rank fails, run_ranks and `planner run` name the rank that failed first and why; its
peers stop within a bounded time with that message instead of a transport error."""

import time

import pytest

from executors.tools.ranks import RankFailure, run_ranks
from tests.dist_plans import bad_input_on_one_rank, hang_on_one_rank


@pytest.mark.parametrize("world,bad", [(2, 1), (4, 2)])
def test_first_failure_is_named_and_peers_stop_with_it(world, bad):
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_ranks(bad_input_on_one_rank, world, bad, timeout_s=120, coll_timeout_s=60)
    took = time.monotonic() - t0
    exc = info.value
    assert exc.first[0] == bad and exc.first[1] == "ValueError" and "has shape (3, 31)" in exc.first[2]
    assert sorted(exc.errors) == list(range(world))
    for r, (kind, msg) in exc.errors.items():
        if r != bad:
            assert kind == "Stopped" and f"rank {bad} failed first" in msg and "(3, 31)" in msg, (r, kind, msg)
    assert str(exc).startswith(f"rank {bad} failed first: ValueError")
    assert took < 45, f"peers took {took:.0f} s to stop (their collective timeout is 60 s)"


def test_peer_that_does_not_stop_is_killed_after_the_grace():
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_ranks(hang_on_one_rank, 2, 1, timeout_s=300, grace_s=2.0)
    assert time.monotonic() - t0 < 40
    assert info.value.first[:2] == (1, "RuntimeError")
    kind, msg = info.value.errors[0]
    assert kind == "Stopped" and "rank 1 failed first: RuntimeError: the bad rank's own failure" in msg


def test_dims_check_names_the_rank_called_with_other_dims():
    from tests.dist_plans import dims_differ
    with pytest.raises(RankFailure) as info:
        run_ranks(dims_differ, 2, True, timeout_s=120, coll_timeout_s=30)
    for r, (kind, msg) in info.value.errors.items():
        assert kind == "DimsMismatch", (r, kind, msg)
        assert "ranks [1]" in msg and "rank 0: num_tokens=8; rank 1: num_tokens=12" in msg


def test_dims_check_is_off_by_default(monkeypatch):
    from executors.agreement import dims_check_enabled
    monkeypatch.delenv("PLANNER_AGREE_DIMS", raising=False)
    assert not dims_check_enabled(None)
    monkeypatch.setenv("PLANNER_AGREE_DIMS", "1")
    assert dims_check_enabled(None) and not dims_check_enabled(False)
