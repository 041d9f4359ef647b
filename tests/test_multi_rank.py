"""`planner run --check` at the deployment's group sizes on CPU: 4 and 8 gloo ranks, the SP
tail (packed gathers) and the K3 plan with its KDA layers (small sizes, same structure)."""

from __future__ import annotations

import pytest
from dist_run import planner_run_ranks

from executors.tools.ranks import run_ranks
from tests.planutil import PLANS

SMALL_TP8 = ["--set", "num_layers=8", "--set", "hidden=64", "--set", "kda_heads=8", "--set", "head_dim=4",
             "--set", "fa_rank=8"]


def _argvs(world: int) -> list[list[str]]:
    common = ["--world-size", str(world), "--check", "--num-tokens", str(3 * world + 1)]
    return [["run", str(PLANS / "k3_sp_tail.yaml"), "--set", f"tp_size={world}", "--set", "hidden=32", *common],
            ["run", str(PLANS / "k3_tp8.yaml"), "--set", f"tp_size={world}", *SMALL_TP8, *common]]


@pytest.mark.slow
@pytest.mark.parametrize("world", [4, 8])
def test_planner_run_check_sp_tail_and_kda_plan(world):
    per_rank = run_ranks(planner_run_ranks, world, _argvs(world), timeout_s=300)
    assert len(per_rank) == world
    for rank, (sp, k3) in enumerate(per_rank):
        for rep in (sp, k3):
            assert rep["rank"] == rank and rep["ok"], rep
        assert sp["plan"] == "k3_sp_tail" and all(o["exact"] and o["max_abs_err"] == 0.0 for o in sp["outputs"])
        assert {o["name"] for o in sp["outputs"]} == {"final_full", "aux2_full", "aux46_full", "aux90_full"}
        assert all(o["shape"] == [3 * world + 1, 32] for o in sp["outputs"])
        assert k3["plan"] == "k3_tp8" and set(k3["variants"].values()) == {"packed"}
        assert len(k3["variants"]) == 6  # the KDA layers of 8 (layers 4 and 8 are MLA)
