"""Plan groups of different sizes under `planner run` (each gets a process group of its own:
all ranks, or rank-contiguous blocks of its size), and plan groups that share one process group
with collectives on two streams, refused at build."""

from dist_ops import MIXED, mixed_groups

from executors.tools.ranks import run_ranks
from planner.cli import main
from tests.planutil import write


def test_groups_of_two_sizes_each_get_their_own_process_group():
    for rank, got in enumerate(run_ranks(mixed_groups, 4, 3, timeout_s=180)):
        assert got["a"] and got["b"], (rank, got)
        assert got["shared"].startswith("plan groups 'tp' and 'ep' are bound to one process group, and their"
                                        " collectives run on two streams (a over 'tp' on main, b over 'ep' on aux)")


def test_planner_run_picks_a_world_every_group_divides(tmp_path, capsys):
    p = write(tmp_path, MIXED)  # the rank body's plan: tp 4, ep 2
    assert main(["run", str(p), "--check", "--num-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "4 rank(s) on cpu" in out and "result: OK (2 outputs x 4 rank(s))" in out, out
    assert main(["run", str(p), "--world-size", "6"]) == 2
    err = capsys.readouterr().err
    assert "plan group 'tp' has size 4, which does not divide --world-size 6" in err
    assert "--set tp_size=6" in err
    assert main(["run", str(p), "--world-size", "128"]) == 2
    assert "128 ranks (--world-size) is more than planner run starts on one machine (64)" in capsys.readouterr().err
