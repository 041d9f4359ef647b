"""Fusion passes and stream pins: a fused op keeps its members' common pin; members whose pins
name different streams are not fused, and the report says so."""

import pytest

from planner.cli import main
from planner.config import CompileConfig
from planner.graph import build_graph
from planner.passes import dce, fuse_collectives
from planner.report import to_text
from tests.planutil import HEADER, compiled, load, write

ARN_HEADER = """
plan: t
params:
  hidden: 64
  tp_size: 2
dims:
  num_tokens: 1..16
groups:
  tp: tp_size
inputs:
  x: bf16[num_tokens, hidden]
  r: bf16[num_tokens, hidden]
weights:
  w: bf16[hidden, hidden]
  nw: bf16[hidden]
"""

CHAIN_HEADER = """
plan: t
dims:
  num_tokens: 1..16
inputs:
  x: bf16[num_tokens, 64]
weights:
  w: bf16[96, 64]
  wb: bf16[16, 32]
"""

# the rule's plan: every tp collective on comm; the third gathers dim 1, so only two can fuse
THREE = """
streams: [main, comm]
outputs: [ya, yb, yc]
ops:
  - ya: all_gather(gemm(x, w), tp, stream=comm)
  - yb: all_gather(gemm(x, w2), tp, stream=comm)
  - yc: all_gather(x, tp, dim=1, stream=comm)
"""


def stream(cp, v):
    return cp.graph.nodes[v]["stream"]


def only_fusion(tmp_path, body):
    """fuse-collectives' report on a plan, run right after dce: pins that name different streams of
    one group are refused by verify before any pass, so the pass's own decision is checked alone."""
    cp = build_graph(load(tmp_path, body))
    cp, _ = dce.run(cp, CompileConfig())
    cp, _ = fuse_collectives.run(cp, CompileConfig())
    return cp


# ---------------------------------------------------------------- fuse-collectives

def test_pinned_gathers_fuse_and_keep_the_pin(tmp_path):
    cp = compiled(tmp_path, """
streams: [main, comm]
outputs: [a, b]
ops:
  - a: all_gather(gemm(x, w), tp, stream=comm)
  - b: all_gather(gemm(x, w2), tp, stream=comm)
""")
    (b,) = cp.report["fuse-collectives"]["buckets"]
    assert b["id"] == "all_gather.fused0" and b["stream"] == "comm"
    assert cp.op("all_gather.fused0").stream == "comm" and stream(cp, "all_gather.fused0") == "comm"
    assert "on stream comm, the members' pin" in to_text(cp, CompileConfig())


def test_the_three_collectives_plan_validates_and_runs(tmp_path, capsys):
    cp = compiled(tmp_path, HEADER + THREE, header="")
    f = cp.report["fuse-collectives"]
    assert [b["members"] for b in f["buckets"]] == [["ya", "yb"]]
    assert stream(cp, "all_gather.fused0") == "comm" and stream(cp, "yc") == "comm"
    assert any("different dim" in nf["reason"] for nf in f["not_fused"])
    path = str(write(tmp_path, HEADER + THREE, "three.yaml"))
    assert main(["validate", path]) == 0, capsys.readouterr().err
    rc = main(["run", path, "--check", "--world-size", "2", "--num-tokens", "5"])
    out = capsys.readouterr().out
    assert rc == 0 and "result: OK (3 outputs x 2 rank(s))" in out, out


@pytest.mark.parametrize("pins, reason", [
    (("comm", None), "different stream pins (pinned to comm vs unpinned)"),
    (("comm", "side"), "different stream pins (pinned to comm vs pinned to side)"),
])
def test_gathers_with_different_pins_are_not_fused(tmp_path, pins, reason):
    a, b = (f", stream={p}" if p else "" for p in pins)
    cp = only_fusion(tmp_path, f"""
streams: [main, comm, side]
outputs: [a, b]
ops:
  - a: all_gather(gemm(x, w), tp{a})
  - b: all_gather(gemm(x, w2), tp{b})
""")
    f = cp.report["fuse-collectives"]
    assert not f["buckets"] and f["after"] == 2
    assert f["not_fused"] == [{"ops": ["a", "b"], "reason": reason + ": the fused op runs on one stream"}]
    assert {cp.op(v).stream for v in ("a", "b")} == set(pins)


def test_a_main_pin_fuses_with_an_unpinned_collective(tmp_path):
    # an unpinned collective stays on main: fusing it with one pinned there drops no pin
    cp = compiled(tmp_path, """
outputs: [a, b]
ops:
  - a: all_gather(gemm(x, w), tp, stream=main)
  - b: all_gather(gemm(x, w2), tp)
""")
    (b,) = cp.report["fuse-collectives"]["buckets"]
    assert b["members"] == ["a", "b"] and cp.op(b["id"]).stream == "main"


def test_a_fused_pin_folded_by_the_bound_is_located(tmp_path):
    cp = compiled(tmp_path, HEADER + THREE, header="", cfg=CompileConfig(num_streams=1, verify_each=True))
    (fold,) = [f for f in cp.report["assign-streams:folded"] if f["text"].startswith("all_gather.fused0")]
    assert fold["loc"] == str(cp.plan.locs["ya"])  # where the first member's pin is written


# ---------------------------------------------------------------- fuse-allreduce-norm

def arn_body(ar_pin="", norm_pin=""):
    return f"""
streams: [main, comm]
outputs: [y, z]
ops:
  - o: gemm(x, w)
  - s: all_reduce(o, tp{ar_pin})
  - y, h: add_rmsnorm(s, r, nw{norm_pin})
  - z: all_reduce(x, tp, stream=comm)
"""


def test_allreduce_norm_keeps_the_all_reduce_pin(tmp_path, capsys):
    body = arn_body(", stream=comm")
    cp = compiled(tmp_path, body, ARN_HEADER)
    (f,) = cp.report["fuse-allreduce-norm"]["fused"]
    assert f["id"] == "y" and f["stream"] == "comm"
    assert cp.op("y").op == "all_reduce_add_rmsnorm" and stream(cp, "y") == "comm" and stream(cp, "z") == "comm"
    assert "on stream comm, the pin it keeps" in to_text(cp, CompileConfig())
    path = str(write(tmp_path, ARN_HEADER + body, "arn.yaml"))
    rc = main(["run", path, "--check", "--world-size", "2", "--num-tokens", "5"])
    out = capsys.readouterr().out
    assert rc == 0 and "result: OK (2 outputs x 2 rank(s))" in out, out


@pytest.mark.parametrize("ar_pin, norm_pin, why", [
    (", stream=comm", ", stream=main", "add_rmsnorm 'y' is pinned to main, the all_reduce is pinned to comm:"
                                       " the fused op runs on one stream"),
    ("", ", stream=comm", "add_rmsnorm 'y' is pinned to comm, the all_reduce is unpinned, and group tp has z on"
                          " main: the fused op is a collective and every collective of one group runs on one"
                          " stream (pin the group's collectives to comm too, or unpin the norm)"),
])
def test_allreduce_norm_with_another_norm_pin_is_not_fused(tmp_path, ar_pin, norm_pin, why):
    body = arn_body(ar_pin, norm_pin).replace("z: all_reduce(x, tp, stream=comm)",
                                              f"z: all_reduce(x, tp{ar_pin})")
    cp = compiled(tmp_path, body, ARN_HEADER)
    rep = cp.report["fuse-allreduce-norm"]
    assert not rep["fused"] and {"ops": ["s"], "reason": why} in rep["not_fused"]
    assert cp.op("y").op == "add_rmsnorm" and stream(cp, "y") == norm_pin.split("=")[1]


def test_allreduce_norm_takes_the_norm_pin_when_only_the_norm_is_pinned(tmp_path):
    cp = compiled(tmp_path, arn_body("", ", stream=main").replace(", stream=comm", ""), ARN_HEADER)
    assert cp.op("y").op == "all_reduce_add_rmsnorm" and cp.op("y").stream == "main"


# ---------------------------------------------------------------- fuse-gemm-chains

def chain_body(first="", second=""):
    return f"""
streams: [main, side]
outputs: [q, g]
ops:
  - p: gemm(x, w{first})
  - q, fa: split(p, [64, 32])
  - g: gemm(fa, wb{second})
"""


def test_pinned_gemm_chain_keeps_the_pin_and_says_so(tmp_path):
    cp = compiled(tmp_path, chain_body(", stream=side", ", stream=side"), CHAIN_HEADER)
    (f,) = cp.report["fuse-gemm-chains"]["fused"]
    assert f["stream"] == "side" and cp.op("p").op == "gemm_chain" and stream(cp, "p") == "side"
    assert "p: p + g -> gemm_chain on columns [64, 96) on stream side, the pin it keeps" in to_text(cp, CompileConfig())


def test_gemm_chain_with_different_pins_is_not_fused_and_reported(tmp_path):
    cp = compiled(tmp_path, chain_body(", stream=side"), CHAIN_HEADER)
    (nf,) = cp.report["fuse-gemm-chains"]["not_fused"]
    assert nf["reason"] == ("the two gemms' pins differ ('p' pinned to side, 'g' unpinned): the fused op runs on"
                            " one stream")
    assert stream(cp, "p") == "side" and cp.op("g").op == "gemm"
    assert "not fused: p + g: the two gemms' pins differ" in to_text(cp, CompileConfig())


def test_gemm_chain_pins_to_aux_and_aux1_name_one_stream(tmp_path):
    # without declared streams aux and aux1 are the pool's first aux stream at every bound
    body = chain_body(", stream=aux", ", stream=aux1").replace("streams: [main, side]\n", "")
    cp = compiled(tmp_path, body, CHAIN_HEADER)
    assert cp.op("p").op == "gemm_chain" and cp.op("p").stream == "aux"


# ---------------------------------------------------------------- pins the bound folds

def test_norm_and_all_reduce_pins_the_bound_folds_onto_main_fuse(tmp_path):
    # aux2 and aux3 both land on main under --streams 1: fusing them moves neither
    body = arn_body(", stream=aux2", ", stream=aux3").replace("streams: [main, comm]\n", "").replace(
        "z: all_reduce(x, tp, stream=comm)", "z: all_reduce(x, tp, stream=aux2)")
    cp = compiled(tmp_path, body, ARN_HEADER, cfg=CompileConfig(num_streams=1, verify_each=True))
    (f,) = cp.report["fuse-allreduce-norm"]["fused"]
    assert f["id"] == "y" and stream(cp, "y") == "main"
    assert any(x["text"].startswith("y pinned to aux2 -> main") for x in cp.report["assign-streams:folded"])
    cp = compiled(tmp_path, body, ARN_HEADER)  # four streams: the pins name two of them
    assert not cp.report["fuse-allreduce-norm"]["fused"]


def test_chain_pins_folded_onto_main_fuse(tmp_path):
    cp = compiled(tmp_path, chain_body(", stream=aux3", ", stream=aux2").replace("streams: [main, side]\n", ""),
                  CHAIN_HEADER, cfg=CompileConfig(num_streams=1))
    (f,) = cp.report["fuse-gemm-chains"]["fused"]
    assert cp.op("p").op == "gemm_chain" and stream(cp, "p") == "main"
