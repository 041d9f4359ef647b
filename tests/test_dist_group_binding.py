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


def test_the_world_size_hint_names_only_the_params_of_the_groups_size(tmp_path, capsys):
    """num_layers = 2 equals tp's size but has nothing to do with it (the hint named both)."""
    p = write(tmp_path, """
plan: t
params:
  tp_size: 2
  num_layers: 2
dims:
  num_tokens: 1..8
groups:
  tp: tp_size
inputs:
  x: bf16[num_tokens, 16]
outputs: [y]
ops:
  - y: all_reduce(x, tp)
""")
    assert main(["run", str(p), "--world-size", "3"]) == 2
    err = capsys.readouterr().err
    assert "--set tp_size=3 or another size that divides 3" in err and "num_layers" not in err, err
    q = write(tmp_path, "plan: u\ngroups:\n  tp: 2\ninputs:\n  x: bf16[4, 16]\noutputs: [y]\nops:\n"
                        "  - y: all_reduce(x, tp)\n", "u.yaml")
    assert main(["run", str(q), "--world-size", "3"]) == 2
    assert "write the group's size as one that divides 3" in capsys.readouterr().err


def test_the_world_size_hint_keeps_to_the_params_choices(tmp_path, capsys):
    p = write(tmp_path, """
plan: t
params:
  tp_size: {value: 2, choices: [1, 2, 4, 8]}
dims:
  num_tokens: 1..8
groups:
  tp: tp_size
inputs:
  x: bf16[num_tokens, 16]
outputs: [y]
ops:
  - y: all_reduce(x, tp)
""")
    assert main(["run", str(p), "--world-size", "6", "--set", "tp_size=8"]) == 2
    assert "--set tp_size=1 or 2 (its choices that divide 6)" in capsys.readouterr().err
