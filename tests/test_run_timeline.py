"""`planner run --timeline`: records per stream and draws them (CPU: wall clock)."""

import json

from planner.cli import main
from tests.planutil import PLANS


def test_run_timeline_svg_and_json(tmp_path, capsys):
    svg = tmp_path / "t.svg"
    assert main(["run", str(PLANS / "k3_kda_projection.yaml"), "--num-tokens", "2", "--check",
                 "--timeline", str(svg), "--as-if-capturing"]) == 0
    out = capsys.readouterr().out
    assert "timeline:" in out and "aux" in out
    # the table ran the gates eagerly (packed); the timeline names the variant it drew
    assert "kda_projection.0         packed" in out
    assert "(gates as if capturing: kda_projection.0 two_branch)" in out
    text = svg.read_text()
    assert "stream main" in text and "stream aux" in text and "qkvg_out" in text
    js = tmp_path / "t.json"
    assert main(["run", str(PLANS / "k3_kda_projection.yaml"), "--num-tokens", "8", "--timeline", str(js)]) == 0
    recs = json.loads(js.read_text())
    assert {r["stream"] for r in recs} == {"main"}  # not capturing: the packed fallback, one stream
    assert all(r["end_us"] >= r["start_us"] for r in recs)


def test_run_timeline_json_names_its_variants(tmp_path, capsys):
    svg = tmp_path / "t.svg"
    assert main(["run", str(PLANS / "k3_kda_projection.yaml"), "--num-tokens", "2", "--emit", "json",
                 "--timeline", str(svg), "--as-if-capturing"]) == 0
    rank0 = json.loads(capsys.readouterr().out)["ranks"][0]
    assert rank0["variants"] == {"kda_projection.0": "packed"}
    assert rank0["timeline"]["variants"] == {"kda_projection.0": "two_branch"}
    assert rank0["timeline"]["capturing"] is True
    assert main(["run", str(PLANS / "k3_kda_projection.yaml"), "--num-tokens", "2",
                 "--timeline", str(svg)]) == 0
    assert "gates as if" not in capsys.readouterr().out  # the same variants: nothing to add


def test_as_if_capturing_without_a_timeline_is_refused(capsys):
    """The flag only selects the variants of the --timeline call: alone it changed nothing."""
    assert main(["run", str(PLANS / "k3_kda_projection.yaml"), "--as-if-capturing"]) == 2
    err = capsys.readouterr().err
    assert "--as-if-capturing" in err and "add --timeline FILE" in err
