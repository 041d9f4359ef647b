"""planner viz / planner timeline: the structure of the emitted DOT and SVG, repeat collapse,
renderer fallbacks, and that the 93-layer Kimi-K3 plan renders in seconds."""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import networkx as nx
import pytest

from planner.cli import main
from planner.errors import PlanError
from planner.graph import build_graph
from planner.lang.loader import load_plan
from planner.viz import VizOptions, to_dot
from planner.viz.collapse import find_repeats
from planner.viz.palette import EVENT_COLOR, KIND_COLORS, kind_color
from planner.viz.render import find_dot
from planner.viz.timeline import (
    TimelineError,
    check_records,
    overlap_us,
    render_timeline,
    timeline_svg,
)
from tests.speed import in_units

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "plans"
HAVE_DOT = find_dot() is not None
needs_dot = pytest.mark.skipif(not HAVE_DOT, reason="Graphviz `dot` not installed")


def compiled(name: str, after: str | None = None, **overrides):
    from planner.pipeline import CompileConfig, compile_plan
    return compile_plan(load_plan(PLANS / name, overrides), CompileConfig(stop_after=after))


# ---------------------------------------------------------------- a small DOT reader (for our own output)

def _text(html_label: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html_label)).strip()


def parse(dot: str) -> SimpleNamespace:
    """Clusters (label text, parent), nodes (label text, attrs, enclosing cluster labels), edges."""
    clusters, nodes, edges, stack = {}, {}, [], []
    lines = dot.splitlines()
    for i, line in enumerate(lines):
        s = line.strip()
        m = re.match(r"subgraph (cluster_\d+) \{$", s)
        if m:
            label = re.match(r"graph \[label=<(.*)>, style=", lines[i + 1].strip())
            clusters[m.group(1)] = SimpleNamespace(label=_text(label.group(1)), parent=stack[-1] if stack else None)
            stack.append(m.group(1))
            continue
        if s == "}":
            if stack:
                stack.pop()
            continue
        m = re.match(r"(n\d+|in\d+|entry) -> (n\d+|exit) \[(.*)\];$", s)
        if m:
            edges.append(SimpleNamespace(u=m.group(1), v=m.group(2), attrs=m.group(3)))
            continue
        m = re.match(r"(n\d+|entry|exit) \[label=(?:<(.*?)>|\"([^\"]*)\"), (\w+=.*)\];$", s)
        if m:
            attrs = dict(re.findall(r'(\w+)="([^"]*)"', m.group(4)))
            nodes[m.group(1)] = SimpleNamespace(label=_text(m.group(2) or m.group(3)), attrs=attrs,
                                                lanes=[clusters[c].label for c in stack])
    return SimpleNamespace(clusters=clusters, nodes=nodes, edges=edges,
                           labels=[c.label for c in clusters.values()])


def node_named(p, kind: str, name: str):
    hits = [n for n in p.nodes.values() if n.label.startswith(f"{kind} {name}")]
    assert len(hits) == 1, (kind, name, [n.label for n in p.nodes.values()])
    return hits[0]


# ---------------------------------------------------------------- shipped plans

def test_kda_projection_lanes_variants_and_events():
    cp = compiled("k3_kda_projection.yaml")
    dot, stats = to_dot(cp)
    p = parse(dot)
    ops = [k for k in p.nodes if k not in ("entry", "exit")]
    assert len(ops) == cp.graph.number_of_nodes() == stats.ops
    assert "stream main" in p.labels and "stream aux" in p.labels
    gate = [lbl for lbl in p.labels if lbl.startswith("variant two_branch")]
    assert gate and "when capturing" in gate[0] and "kda_two_branch_max" in gate[0]
    assert any(lbl.startswith("variant packed (fallback") for lbl in p.labels)
    # the two branches: QKVG on main, F_A/beta -> F_B on aux, inside the two_branch box
    qkvg = node_named(p, "gemm", "qkvg_out")
    fab = node_named(p, "gemm", "fab_out")
    assert {qkvg.lanes[-1], fab.lanes[-1]} == {"stream main", "stream aux"}  # the two branches, either way round
    assert all(any(x.startswith("variant two_branch") for x in n.lanes) for n in (qkvg, fab))
    # the packed variant's gemm -> split -> gemm is one fused op (fuse-gemm-chains)
    chain = node_named(p, "gemm_chain · fused ×2", "proj")
    assert any(x.startswith("variant packed") for x in chain.lanes) and "g1 [num_tokens, 1536]" in chain.label
    # fork and join: event edges main -> aux and aux -> main, drawn apart from data edges
    ev = [e for e in p.edges if EVENT_COLOR in e.attrs]
    assert ev and all("dashed" in e.attrs for e in ev)

    def lane(nid):
        return p.nodes[nid].lanes[-1]
    assert {(lane(e.u), lane(e.v)) for e in ev} >= {("stream main", "stream aux"), ("stream aux", "stream main")}
    data = [e for e in p.edges if EVENT_COLOR not in e.attrs]
    assert len(data) >= cp.graph.number_of_edges()  # plus the edges from the plan input x
    # output shapes in the labels, stable colours per kind
    assert "[num_tokens, 6144] bf16" in qkvg.label
    for n in p.nodes.values():
        kind = n.label.split()[0]
        if kind in KIND_COLORS:
            assert n.attrs["fillcolor"] == KIND_COLORS[kind][0]
    legend = re.search(r"legend \[.*\];", dot).group(0)
    for word in ("gemm", "split", "select", "event", "stream aux", "data"):
        assert word in legend


def test_legend_names_the_double_border_only_where_one_is_drawn():
    """A fused gemm chain lists what it absorbed but has no double border (no collective): the
    KDA plan's legend has no "fused collective" row; the SP tail's fused gather has both."""
    kda = to_dot(compiled("k3_kda_projection.yaml"))[0]
    assert "fused ×2" in kda and "peripheries" not in kda
    assert "fused collective" not in re.search(r"legend \[.*\];", kda).group(0)
    sp = to_dot(compiled("k3_sp_tail.yaml"))[0]
    assert "peripheries" in sp and "fused collective" in re.search(r"legend \[.*\];", sp).group(0)


def test_sp_tail_fused_gather_is_one_node_listing_what_it_absorbed():
    cp = compiled("k3_sp_tail.yaml")
    p = parse(to_dot(cp)[0])
    gathers = [n for n in p.nodes.values() if n.label.startswith("all_gather")]
    assert len(gathers) == 1
    g = gathers[0]
    assert g.attrs.get("peripheries") == "2" and "fused ×4" in g.label
    for name in ("final_full", "aux2_full", "aux46_full", "aux90_full"):
        assert name in g.label
    assert "double border: fused collective" in to_dot(cp)[0]
    # before fusion: four separate gathers, none drawn as fused
    before = parse(to_dot(compiled("k3_sp_tail.yaml", after="dce"))[0])
    plain = [n for n in before.nodes.values() if n.label.startswith("all_gather")]
    assert len(plain) == 4 and not any("peripheries" in n.attrs for n in plain)


def test_tp8_collapses_repeated_layers_and_renders_in_seconds(tmp_path):
    t0 = time.perf_counter()
    cp = compiled("k3_tp8.yaml")
    dot, stats = to_dot(cp)
    build_s = in_units(time.perf_counter() - t0)
    p = parse(dot)
    assert stats.ops > 1000 and len(p.nodes) < 60
    rep = [lbl for lbl in p.labels if lbl.startswith("×")]
    assert any(lbl.startswith("×69 ") for lbl in rep) and any(lbl.startswith("×24 ") for lbl in rep)
    names = {n.label.split()[1] for n in p.nodes.values()}
    assert "x0" in names and "x1" not in names and "x91" not in names
    # the whole KDA layer is inside the x69 box, both branches included
    fab, qkvg = node_named(p, "gemm", "fab_out"), node_named(p, "gemm", "qkvg_out")
    assert fab.lanes[0].startswith("×69") and {fab.lanes[-1], qkvg.lanes[-1]} == {"stream main", "stream aux"}
    assert any("next block" in e.attrs for e in p.edges)
    # --expand draws every op
    full, _ = to_dot(cp, VizOptions(expand=True))
    assert len(parse(full).nodes) == cp.graph.number_of_nodes()
    assert not any(lbl.startswith("×") for lbl in parse(full).labels)
    # about 1 s on a dev machine where a reference workload takes 5 ms (200 units); a DOT or a
    # picture that grew with the ops instead of the collapsed boxes would take minutes
    assert build_s < 2000, f"compile + DOT took {build_s:.0f} units"
    if HAVE_DOT:
        t1 = time.perf_counter()
        assert main(["viz", str(PLANS / "k3_tp8.yaml"), "-o", str(tmp_path / "tp8.png")]) == 0
        assert (tmp_path / "tp8.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert in_units(time.perf_counter() - t1) < 4000


def test_variant_selection():
    cp = compiled("k3_tp8.yaml")
    p = parse(to_dot(cp, VizOptions(variant="packed"))[0])
    assert not any("two_branch" in lbl for lbl in p.labels)
    assert any(lbl.startswith("variant packed") for lbl in p.labels)
    assert not any(n.label.startswith("gemm qkvg_out") for n in p.nodes.values())
    with pytest.raises(PlanError) as e:
        to_dot(cp, VizOptions(variant="two_brnach"))
    assert "two_branch" in str(e.value)


def test_hand_annotated_streams_and_entry_event():
    """No pipeline: streams and events set by hand, as the contract describes them."""
    cp = build_graph(load_plan(PLANS / "k3_kda_projection.yaml"))
    g = cp.graph
    cp.streams = ["main", "comm"]
    branch = [v for v in g if v.startswith("kda_projection.0/two_branch/") and v.split("/")[-1] in ("fab_out", "f_a", "g1")]
    assert len(branch) == 3
    for v in branch:
        g.nodes[v]["stream"] = "comm"
    g1 = next(v for v in branch if v.endswith("/g1"))
    cp.events = {"entry": {"op": None, "stream": "main"}, "ev.g1": {"op": g1, "stream": "comm"}}
    g.nodes[next(v for v in branch if v.endswith("/fab_out"))]["waits"] = ["entry"]
    g.nodes[g1]["records"] = ["ev.g1"]
    g.nodes["g1"]["waits"] = ["ev.g1"]
    dot, stats = to_dot(cp)
    p = parse(dot)
    assert stats.streams == ["main", "comm"]
    assert "stream comm" in p.labels
    assert "entry" in p.nodes and p.nodes["entry"].lanes == ["stream main"]
    ev = [e for e in p.edges if EVENT_COLOR in e.attrs]
    assert {e.u for e in ev} == {"entry", next(k for k, n in p.nodes.items() if n.label.startswith("gemm g1")
                                                 and n.lanes[-1] == "stream comm")}
    assert any('label="ev.g1"' in e.attrs for e in ev)


# ---------------------------------------------------------------- repeat detection

def _chain(n_blocks: int, kinds=("gemm", "add"), broken: int | None = None) -> tuple[nx.DiGraph, list[str]]:
    g, order, prev = nx.DiGraph(), [], None
    for i in range(n_blocks):
        ids = [f"{k}{i}" for k in kinds]
        for v, k in zip(ids, kinds, strict=True):
            g.add_node(v, op=SimpleNamespace(id=v, op=k, out=[v]), ctx=(), stream="main")
            order.append(v)
        if prev:
            g.add_edge(prev, ids[0])
        if i != broken:
            g.add_edge(ids[0], ids[1])
        prev = ids[-1]
    return g, order


def test_find_repeats_structural():
    g, order = _chain(5)
    reps = find_repeats(g, order, min_count=3)
    assert [(r.period, r.count) for r in reps] == [(2, 5)]
    assert reps[0].rep("add3") == "add0"
    # block 3 wired differently: the run stops before it (3 blocks still repeat)
    g, order = _chain(6, broken=3)
    reps = find_repeats(g, order, min_count=3)
    assert [(r.period, r.count) for r in reps] == [(2, 3)]
    # different kinds never repeat
    g, order = _chain(2)
    assert find_repeats(g, order, min_count=3) == []


# ---------------------------------------------------------------- CLI and renderer fallbacks

def test_cli_dot_html_and_errors(tmp_path, capsys, monkeypatch):
    plan = str(PLANS / "k3_kda_projection.yaml")
    assert main(["viz", plan, "-o", str(tmp_path / "a.dot")]) == 0
    assert (tmp_path / "a.dot").read_text().startswith("digraph plan {")
    assert main(["viz", plan, "-o", str(tmp_path / "a.jpg")]) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("plan: bad\nops:\n  - y: gemm(nope, nope)\n")
    assert main(["viz", str(bad), "-o", str(tmp_path / "b.svg")]) == 2
    err = capsys.readouterr().err
    assert "error[" in err and "Traceback" not in err
    if HAVE_DOT:
        assert main(["viz", plan, "--set", "tp_size=8", "-o", str(tmp_path / "a.html")]) == 0
        page = (tmp_path / "a.html").read_text()
        assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "</svg>" in page
        assert "<script" not in page and "<link" not in page and 'src="http' not in page
        svg = ET.fromstring(_svg_only(main, plan, tmp_path))
        ns = "{http://www.w3.org/2000/svg}"
        classes = [e.get("class") for e in svg.iter(f"{ns}g")]
        assert classes.count("cluster") >= 5 and classes.count("node") >= 14 and classes.count("edge") >= 15
    # no renderer: DOT next to the requested picture, exit 1, a message, no traceback
    monkeypatch.setenv("PLANNER_DOT", "")
    assert main(["viz", plan, "-o", str(tmp_path / "c.png")]) == 1
    assert (tmp_path / "c.dot").read_text().startswith("digraph plan {") and not (tmp_path / "c.png").exists()
    err = capsys.readouterr().err
    assert "apt-get install graphviz" in err and "Traceback" not in err


def _svg_only(main_fn, plan, tmp_path) -> str:
    assert main_fn(["viz", plan, "-o", str(tmp_path / "a.svg")]) == 0
    return (tmp_path / "a.svg").read_text()


# ---------------------------------------------------------------- timeline

RECORDS = [
    {"stream": "main", "op": "x", "kind": "extern", "start_us": 100.0, "end_us": 103.0},
    {"stream": "main", "op": "kda0/two_branch/qkvg_out", "kind": "gemm", "start_us": 103.5, "end_us": 126.5},
    {"stream": "aux", "op": "kda0/two_branch/fab_out", "kind": "gemm", "start_us": 104.0, "end_us": 109.0},
    {"stream": "aux", "op": "kda0/two_branch/g1", "kind": "gemm", "start_us": 110.0, "end_us": 112.0},
    {"stream": "main", "op": "all_gather.fused0", "kind": "all_gather", "start_us": 130.0, "end_us": 140.0},
]


def test_timeline_svg_structure():
    svg = timeline_svg(RECORDS, title="kda")
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert "stream main" in texts and "stream aux" in texts and "kda" in texts
    bars = [r for r in root.iter(f"{ns}rect") if r.find(f"{ns}title") is not None
            and " on " in r.find(f"{ns}title").text]
    assert len(bars) == len(RECORDS)
    by_op = {r.find(f"{ns}title").text.split(" (")[0]: r for r in bars}
    assert by_op["kda0/two_branch/qkvg_out"].get("fill") == kind_color("gemm")[0]
    assert by_op["all_gather.fused0"].get("fill") == kind_color("all_gather")[0]
    # main row above aux row; a bar's x and width follow its times (linear axis)
    y = {t.text: float(t.get("y")) for t in root.iter(f"{ns}text") if t.text and t.text.startswith("stream ")}
    assert y["stream main"] < y["stream aux"]
    q, f = by_op["kda0/two_branch/qkvg_out"], by_op["kda0/two_branch/fab_out"]
    assert float(q.get("width")) / float(f.get("width")) == pytest.approx(23 / 5, rel=1e-3)
    assert float(f.get("x")) > float(q.get("x"))
    assert "streams overlap 7.0 us" in svg


def test_timeline_overlap_and_validation():
    assert overlap_us(RECORDS) == [(104.0, 109.0), (110.0, 112.0)]
    assert overlap_us([r for r in RECORDS if r["stream"] == "main"]) == []
    with pytest.raises(TimelineError):
        check_records([])
    with pytest.raises(TimelineError, match="before"):
        check_records([{"stream": "main", "op": "a", "kind": "gemm", "start_us": 5, "end_us": 1}])
    with pytest.raises(TimelineError, match="lacks"):
        check_records([{"stream": "main", "op": "a"}])


def test_timeline_times_must_be_finite():
    for s, e in ((float("nan"), 1.0), (0.0, float("inf"))):
        with pytest.raises(TimelineError, match="must be finite numbers"):
            check_records([{"stream": "main", "op": "a", "kind": "gemm", "start_us": s, "end_us": e}])


def test_timeline_picture_formats_are_svg_and_png(tmp_path, capsys):
    """-o out.pdf would get SVG text under a .pdf name: exit 2 before anything is drawn, naming
    the formats (planner run --timeline also takes .json records)."""
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps(RECORDS))
    for name in ("t.pdf", "t"):
        assert main(["timeline", str(rec), "-o", str(tmp_path / name)]) == 2
        assert not (tmp_path / name).exists()
        assert "unknown timeline format" in capsys.readouterr().err
    plan = PLANS / "k3_kda_projection.yaml"
    assert main(["run", str(plan), "--num-tokens", "2", "--timeline", str(tmp_path / "t.pdf")]) == 2
    err = capsys.readouterr().err
    assert "--timeline" in err and ".json" in err and not (tmp_path / "t.pdf").exists()


def test_timeline_cli(tmp_path, capsys, monkeypatch):
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"title": "t", "records": RECORDS}))
    assert main(["timeline", str(rec), "-o", str(tmp_path / "t.svg")]) == 0
    ET.fromstring((tmp_path / "t.svg").read_text())
    if HAVE_DOT:
        assert main(["timeline", str(rec), "-o", str(tmp_path / "t.png")]) == 0
        assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"stream": "main", "op": "a", "start_us": 3, "end_us": 1}]))
    assert main(["timeline", str(bad), "-o", str(tmp_path / "x.svg")]) == 2
    assert main(["timeline", str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.svg")]) == 2
    assert "Traceback" not in capsys.readouterr().err
    # no PNG renderer at all: the SVG is written instead and the exit code says so
    import builtins
    real_import = builtins.__import__

    def no_mpl(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_mpl)
    monkeypatch.setenv("PLANNER_DOT", "")
    assert main(["timeline", str(rec), "-o", str(tmp_path / "n.png")]) == 1
    assert (tmp_path / "n.svg").exists() and not (tmp_path / "n.png").exists()
    assert render_timeline(RECORDS, tmp_path / "m.png").suffix == ".svg"


def test_every_op_kind_has_a_colour_of_its_own():
    from planner.ops import OP_KINDS
    from planner.viz.palette import KIND_COLORS, kind_color
    missing = [k for k in OP_KINDS if k not in KIND_COLORS]
    assert not missing, missing
    fills = [kind_color(k)[0].lower() for k in OP_KINDS]
    assert len(set(fills)) == len(fills), sorted(f for f in fills if fills.count(f) > 1)


def test_timeline_busy_time_counts_overlapping_ops_once(tmp_path, capsys):
    import json

    from planner.cli import main
    recs = [{"stream": "main", "op": "a", "kind": "gemm", "start_us": 0, "end_us": 3},
            {"stream": "main", "op": "b", "kind": "add", "start_us": 2, "end_us": 4}]
    p = tmp_path / "rec.json"
    p.write_text(json.dumps(recs))
    assert main(["timeline", str(p), "-o", str(tmp_path / "t.svg")]) == 0
    svg = (tmp_path / "t.svg").read_text()
    assert "main busy 4.0 us" in svg and "main busy 5.0" not in svg


def test_viz_variant_removed_by_the_compile_and_after_a_disabled_pass_are_refused(tmp_path, capsys):
    """--variant two_branch at tp_size 4 (dce removes it) drew only the region's selects; --after
    a disabled pass drew the fully planned graph under its title."""
    kda = str(Path(__file__).resolve().parent.parent / "plans" / "k3_kda_projection.yaml")
    assert main(["viz", kda, "--set", "tp_size=4", "--variant", "two_branch", "-o", str(tmp_path / "a.dot")]) == 2
    assert "the compile removed variant 'two_branch'" in capsys.readouterr().err
    assert main(["viz", kda, "--after", "dce", "--disable", "dce", "-o", str(tmp_path / "b.dot")]) == 2
    assert "pass 'dce' is disabled, so nothing can be shown after it" in capsys.readouterr().err
    assert main(["viz", kda, "--timeout", "-1", "-o", str(tmp_path / "c.png")]) != 0


def test_viz_does_not_draw_over_the_plan(tmp_path, capsys):
    import shutil
    p = tmp_path / "p.yaml"
    shutil.copy(Path(__file__).resolve().parent.parent / "plans" / "k3_sp_tail.yaml", p)
    before = p.read_text()
    assert main(["viz", str(p), "-o", str(p), "--format", "dot"]) == 2
    assert "is the plan file itself" in capsys.readouterr().err and p.read_text() == before
