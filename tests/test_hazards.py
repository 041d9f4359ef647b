"""planner/hazards.py: each check has a plan that violates it and the located error it gets.

The collective-stream and capture checks are reachable from plans as written; the buffer
checks guard the planner itself, so their plans are compiled and then given the defect a
planner bug would introduce (a second writer, a missing wait)."""

import pytest

from planner.config import CompileConfig
from planner.hazards import HazardError, check_hazards
from planner.verify import VerifyError, verify
from tests.planutil import compiled, load

H = """
plan: hz
params: {hidden: 64}
dims: {num_tokens: 1..64}
groups: {tp: 2}
inputs:
  x: bf16[num_tokens, hidden]
  y: bf16[num_tokens, hidden]
weights:
  w: bf16[64, hidden]
  v: bf16[hidden, 64]
"""


def located(exc, tmp_path, text_in_line: str | None = None):
    d = exc.diagnostics[0]
    assert d.loc is not None and d.loc.line > 0 and str(tmp_path) in d.loc.file
    if text_in_line:
        assert text_in_line in open(d.loc.file).read().splitlines()[d.loc.line - 1]
    return d


def test_shipped_and_sample_plans_are_hazard_free(tmp_path):
    cp = compiled(tmp_path, """
outputs: [a, b, c]
ops:
  - a: all_gather(gemm(x, w), tp)
  - b: all_gather(gemm(y, w), tp)
  - c: gemm(gemm(y, w), v)
""", H)
    verify(cp)


def test_write_after_write_into_a_packed_slot(tmp_path):
    cp = compiled(tmp_path, """
outputs: [a, b]
ops:
  - a: all_gather(gemm(x, w), tp)
  - b: all_gather(gemm(y, w), tp)
""", H)
    writers = [v for v in cp.graph.nodes if cp.graph.nodes[v].get("out_slot")]
    assert len(writers) == 2
    # a planner bug: both producers write the same slot
    first, second = writers
    cp.graph.nodes[second]["out_slot"] = cp.graph.nodes[first]["out_slot"]
    with pytest.raises(HazardError, match="write-after-write") as ei:
        verify(cp)
    located(ei.value, tmp_path, "gemm(")


def test_write_after_read_through_an_alias(tmp_path):
    cp = compiled(tmp_path, """
outputs: [c, d]
ops:
  - a: gemm(x, w)
  - c: gemm(a[:, :64], v)
  - d: gemm(gemm(y, w), v)
""", H, cfg=CompileConfig(verify_each=True, disable_passes={"fuse-gemm-chains"}))  # plain gemms
    g = cp.graph
    side = [n for n in g.nodes if g.nodes[n]["stream"] != "main" and g.nodes[n]["op"].op == "gemm"]
    assert side, "the independent gemm chain runs beside a and c"
    # a planner bug: a side-stream op writes in place into x, which main's gemm still reads
    g.nodes[side[0]]["out_slot"] = ("x", 1, 0, 64)
    with pytest.raises(HazardError, match="write-after-read") as ei:
        verify(cp)
    d = located(ei.value, tmp_path)
    assert "still reads" in d.message and "on main" in d.message


def test_side_stream_write_into_a_packed_buffer_unordered_after_main(tmp_path):
    cp = compiled(tmp_path, """
outputs: [a, b, c]
ops:
  - a: all_gather(gemm(x, w), tp)
  - b: all_gather(gemm(y, w, stream=aux), tp)
  - c: gemm(gemm(x, w), v)
""", H)
    g = cp.graph
    (w,) = [n for n in g.nodes if g.nodes[n].get("out_slot") and g.nodes[n]["stream"] == "aux"]
    verify(cp)
    g.nodes[w]["waits"] = []  # the fork wait dropped: aux may write before main is done with the memory
    with pytest.raises(VerifyError, match="without waiting on the call's entry"):
        verify(cp)  # the ordering check sees the dropped wait first; the hazard check names the buffer
    with pytest.raises(HazardError, match="buffer reuse across streams") as ei:
        check_hazards(cp)
    located(ei.value, tmp_path, "stream=aux")


def test_collectives_of_one_group_on_two_streams(tmp_path):
    cfg = CompileConfig(disable_passes={"fuse-collectives"}, verify_each=False)
    with pytest.raises(HazardError, match="issued from two streams") as ei:  # compile verifies its result
        compiled(tmp_path, """
outputs: [a, b]
ops:
  - a: all_gather(x, tp)
  - b: all_gather(y, tp, stream=aux)
""", H, cfg=cfg)
    located(ei.value, tmp_path, "stream=aux")


GATED = """
outputs: [z]
ops:
  - region: r
    outputs: [z]
    variants:
      - name: gathered
        when: num_tokens <= 8
        ops:
          - z: all_gather(x, tp)
      - name: local
        ops:
          - z: cat(x, x, dim=0)
"""


def test_rank_varying_gate_over_different_collectives(tmp_path):
    cp = compiled(tmp_path, GATED, H)
    verify(cp)  # a rank-uniform gate: every rank takes the same variant
    # the loader refuses rank-varying gates over collectives; the check proves it on the compiled plan
    cp.variants["r"][0].uses = {"rank"}
    with pytest.raises(HazardError, match="can differ between ranks") as ei:
        verify(cp)
    d = located(ei.value, tmp_path)
    assert "'gathered'" in d.message and "'local'" in d.message


H_XT = H.replace("  y: bf16[num_tokens, hidden]\n", "  y: bf16[num_tokens, hidden]\n  xt: bf16[hidden, num_tokens]\n")
SUMS_OVER_PADDED = """
outputs: [s]
ops:
  - region: r
    outputs: [s]
    variants:
      - name: graphed
        when: capturing and num_tokens <= 32
        ops:
          - s: gemm(xt, xt)
      - name: eager
        ops:
          - s: gemm(xt, xt)
"""


def test_capture_gated_variant_that_sums_over_padded_rows(tmp_path):
    h, body = H_XT, SUMS_OVER_PADDED
    plan = load(tmp_path, body, h)
    from planner.pipeline import compile_plan
    with pytest.raises(HazardError, match="capture: variant 'graphed'") as ei:
        compile_plan(plan, CompileConfig())  # compile verifies its result
    d = located(ei.value, tmp_path, "gemm(xt, xt)")
    assert "sums over num_tokens (K = num_tokens)" in d.message, d.message  # the dim as written, no internal repr
    # the same op outside capture-gated variants is fine
    cp = compiled(tmp_path, "outputs: [s]\nops:\n  - s: gemm(xt, xt)\n", h)
    verify(cp)


def test_capture_gated_shard_of_the_bucketed_dim(tmp_path):
    body = """
outputs: [s]
ops:
  - region: r
    outputs: [s]
    variants:
      - name: graphed
        when: capturing
        ops:
          - s: shard(x, tp)
      - name: eager
        ops:
          - s: shard(y, tp)
"""
    with pytest.raises(HazardError, match="cuts num_tokens into per-rank chunks"):
        compiled(tmp_path, body, H, cfg=CompileConfig())  # compile verifies its result


def test_validate_runs_the_planned_checks_too(tmp_path, capsys):
    """A plan `validate` accepts, `compile` accepts: the hazard checks of a planned plan run in
    validate as well, with the same located error and exit code 2."""
    from planner.cli import main
    from tests.planutil import write
    h, body = H_XT, SUMS_OVER_PADDED
    p = write(tmp_path, h.lstrip("\n") + body)
    assert main(["validate", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{p}:" in err and "capture: variant 'graphed'" in err
    assert main(["compile", str(p)]) == 2
    ok = write(tmp_path, h.lstrip("\n") + "outputs: [s]\nops:\n  - s: gemm(xt, xt)\n", "ok.yaml")
    assert main(["validate", str(ok)]) == 0
    assert "planned and verified" in capsys.readouterr().out
