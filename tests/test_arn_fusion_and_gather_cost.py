"""fuse-allreduce-norm: its refusals' shape, gathered operands, the norm's pin; the cost model's
p2p all-gather price only where the p2p gather can run."""

import pytest

from planner.config import CompileConfig
from planner.cost import CostModel, DeviceProfile, gather_takes_p2p
from planner.report import to_json, to_text
from tests.planutil import compiled, ops_by_kind, write

NAME = "fuse-allreduce-norm"
H = """
plan: t
params:
  hidden: 64
dims:
  num_tokens: 1..16
groups:
  tp: 2
  dp: 2
inputs:
  o: bf16[num_tokens, hidden]
  r: bf16[num_tokens, hidden]
  z: bf16[num_tokens, hidden]
  half: bf16[num_tokens, hidden / 2]
  wide: bf16[num_tokens, hidden * 2]
weights:
  w: bf16[hidden]
"""


def fused_ids(cp):
    return [f["id"] for f in cp.report[NAME]["fused"]]


# ---------------------------------------------------------------- not_fused: {ops, reason}

def test_refusals_list_op_ids_as_documented(tmp_path):
    cp = compiled(tmp_path, """
outputs: [y, r2, s]
ops:
  - s: all_reduce(o, tp)
  - y, r2: add_rmsnorm(s, r, w)
""", H)
    why = "its result 's' is a plan output"
    assert cp.report[NAME]["not_fused"] == [{"ops": ["s"], "reason": why}]
    assert to_json(cp, CompileConfig())["allreduce_norm_fusion"]["not_fused"] == [{"ops": ["s"], "reason": why}]
    assert f"not fused: s: {why}" in to_text(cp, CompileConfig())


# ---------------------------------------------------------------- the other operand's group

def test_residual_gathered_over_another_group_fuses(tmp_path):
    cp = compiled(tmp_path, """
outputs: [y, r2]
ops:
  - res: all_gather(half, dp, dim=1)
  - s: all_reduce(o, tp)
  - y, r2: add_rmsnorm(s, res, w)
""", H)
    assert fused_ids(cp) == ["y"] and not cp.report[NAME]["not_fused"]
    op = cp.op("y")
    assert op.op == "all_reduce_add_rmsnorm" and (op.x, op.residual, op.group) == ("o", "res", "tp")


@pytest.mark.parametrize("make", ["res: reduce_scatter(wide, dp, dim=1)", "full: all_reduce(z, dp)\n  - res: full[:num_tokens]"])
def test_residual_reduced_over_another_group_is_refused(tmp_path, make):
    # a reduce_scatter reduces too, and a view of a reduction is still one
    cp = compiled(tmp_path, f"""
outputs: [y, r2]
ops:
  - {make}
  - s: all_reduce(o, tp)
  - y, r2: add_rmsnorm(s, res, w)
""", H)
    assert "all_reduce_add_rmsnorm" not in ops_by_kind(cp)
    (nf,) = [e for e in cp.report[NAME]["not_fused"] if e["ops"] == ["s"]]
    assert nf["reason"] == ("add_rmsnorm 'y' adds 'res', reduced over group dp, to a sum over tp: the fused op"
                            " reduces one operand over one group")


# ---------------------------------------------------------------- only the norm pinned

def test_only_the_norm_pinned_fuses_onto_its_pin(tmp_path):
    cp = compiled(tmp_path, """
outputs: [y, r2]
ops:
  - s: all_reduce(o, tp)
  - y, r2: add_rmsnorm(s, r, w, stream=aux)
""", H)  # compiled() verifies after every pass: the collective on aux passes the hazard checks
    (f,) = cp.report[NAME]["fused"]
    assert f["stream"] == "aux" and cp.op("y").stream == "aux" and cp.graph.nodes["y"]["stream"] == "aux"
    assert "y: all_reduce s + add_rmsnorm y -> all_reduce_add_rmsnorm over 'tp' (bf16) on stream aux, the pin it keeps" \
        in to_text(cp, CompileConfig())


def test_only_the_norm_pinned_runs_as_the_unfused_ops(tmp_path, capsys):
    from planner.cli import main
    path = write(tmp_path, H + """
outputs: [y, r2]
ops:
  - s: all_reduce(o, tp)
  - y, r2: add_rmsnorm(s, r, w, stream=aux)
""", "pin.yaml")
    rc = main(["run", str(path), "--check", "--world-size", "2", "--num-tokens", "5"])
    out = capsys.readouterr().out
    assert rc == 0 and "result: OK (2 outputs x 2 rank(s))" in out, out


def test_only_the_norm_pinned_is_refused_where_the_group_has_collectives_elsewhere(tmp_path):
    body = """
outputs: [y, r2, gz]
ops:
  - s: all_reduce(o, tp)
  - y, r2: add_rmsnorm(s, r, w, stream=aux)
  - gz: all_reduce(z, {group})
"""
    cp = compiled(tmp_path, body.format(group="tp"), H)
    (nf,) = [e for e in cp.report[NAME]["not_fused"] if e["ops"] == ["s"]]
    assert nf["reason"] == ("add_rmsnorm 'y' is pinned to aux, the all_reduce is unpinned, and group tp has gz on"
                            " main: the fused op is a collective and every collective of one group runs on one"
                            " stream (pin the group's collectives to aux too, or unpin the norm)")
    assert cp.op("y").op == "add_rmsnorm"
    # a collective over another group on main does not stand in the way
    cp = compiled(tmp_path, body.format(group="dp"), H)
    assert fused_ids(cp) == ["y"] and cp.graph.nodes["y"]["stream"] == "aux" and cp.graph.nodes["gz"]["stream"] == "main"


# ---------------------------------------------------------------- the p2p gather's price

GATHERS = """
plan: g
dims:
  num_tokens: 1..4096
  width: 8..64
groups:
  tp: 2
inputs:
  a: bf16[num_tokens, 7168]
  d: bf16[num_tokens, width]
outputs: [g0, g1, gt, gp, gn, gd]
ops:
  - g0: all_gather(a, tp)
  - g1: all_gather(a, tp, dim=1)
  - gt: all_gather(a, tp, backend=torch)
  - gp: all_gather(a, tp, backend=p2p)
  - gn: all_gather(a, tp, dim=-2)
  - gd: all_gather(d, tp)
"""


def gather_costs(tmp_path, **profile):
    cp = compiled(tmp_path, "", GATHERS, cfg=CompileConfig(disable_passes={"fuse-collectives"}))
    model = CostModel(DeviceProfile(**profile), cp.plan.groups)
    b = {"num_tokens": 64, "width": 64}
    return cp, {v: round(model.op_us(cp.op(v), cp.tensors, b), 3) for v in ("g0", "g1", "gt", "gp", "gn", "gd")}


def test_gathers_the_p2p_path_cannot_run_cost_the_nccl_rate(tmp_path):
    _, us = gather_costs(tmp_path)
    _, nccl = gather_costs(tmp_path, p2p_gbps=0)
    assert len(set(nccl.values()) - {nccl["gd"]}) == 1  # without p2p every gather of `a` costs the same
    assert us["g0"] == us["gp"] == us["gn"] < nccl["g0"]  # dim 0 (also written -2), auto or p2p
    assert us["g1"] == nccl["g1"] and us["gt"] == nccl["gt"] and us["gd"] == nccl["gd"]


@pytest.mark.parametrize("v", ["g0", "g1", "gt", "gp", "gn", "gd"])
def test_the_planner_rule_agrees_with_the_executor_lookup(tmp_path, monkeypatch, v):
    # the backend lookup as on a CUDA host with symmetric memory: p2p is chosen where the rule says
    from executors.backends import lookup, p2p
    monkeypatch.delenv("PLANNER_P2P", raising=False)
    monkeypatch.setattr(p2p, "_symm", lambda: None)
    cp, _ = gather_costs(tmp_path)
    op = cp.op(v)
    spec = cp.tensors[op.x]
    takes = gather_takes_p2p(op, spec)
    assert takes == (v in ("g0", "gp", "gn"))
    assert (lookup(op, [spec], "cuda").backend == "p2p") == takes
