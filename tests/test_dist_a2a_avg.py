"""all_to_all and reduce=avg across gloo ranks (gloo has no AVG: emulated as sum / size)."""

import pytest
from dist_ops import a2a_and_avg

from executors.tools.ranks import run_ranks


@pytest.mark.parametrize("world", [2, 4])
def test_all_to_all_and_avg_match_reference_and_semantics(world):
    reps = run_ranks(a2a_and_avg, world, 5, timeout_s=180)
    for rank, rep in enumerate(reps):
        assert rep["ok"], rep["outputs"]
        assert rep["independent"] == {"y": True, "got": True, "avg": True, "rs_avg": True}, (rank, rep["independent"])
