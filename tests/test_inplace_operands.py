"""What an in-place op writes over: add_rmsnorm writes x and residual, the fused all-reduce + norm
only residual (x is reduced into a new buffer). The in-place checks, collective packing, the
executor's copy-before-write set and the picture all go by the same list."""

from executors.lowering import overwritten
from planner.opbase import written_in_place
from planner.viz.dot import to_dot
from tests.planutil import compiled, error

H = """
plan: t
params: {hidden: 64}
dims: {num_tokens: 1..16}
groups: {tp: 2}
inputs:
  o: bf16[num_tokens, hidden]
  res: bf16[num_tokens, hidden]
  p1: bf16[num_tokens, 32]
  p2: bf16[num_tokens, 32]
weights:
  w: bf16[hidden]
"""


def test_the_fused_op_written_by_hand_may_share_its_x(tmp_path):
    cp = compiled(tmp_path, """
outputs: [y, r2, k]
ops:
  - r1: copy(res)
  - y, r2: all_reduce_add_rmsnorm(o, r1, w, tp, inplace=true)
  - k: add(o, o)
""", H)
    op = cp.graph.nodes["y"]["op"]
    assert written_in_place(op) == ["r1"]
    assert overwritten(cp) == {"r1"}
    # its residual is still guarded
    e = error(tmp_path, """
outputs: [y, r2, k]
ops:
  - r1: copy(res)
  - y, r2: all_reduce_add_rmsnorm(o, r1, w, tp, inplace=true)
  - k: add(r1, o)
""", H)
    assert "inplace overwrites 'r1', which 'k' also reads" in str(e)


def test_add_rmsnorm_writes_both(tmp_path):
    e = error(tmp_path, """
outputs: [y, r2, k]
ops:
  - r1: copy(res)
  - s: copy(o)
  - y, r2: add_rmsnorm(s, r1, w, inplace=true)
  - k: add(s, o)
""", H)
    assert "inplace overwrites 's', which 'k' also reads" in str(e)


def test_a_gather_feeding_the_fused_ops_x_still_packs_and_the_picture_names_residual_only(tmp_path):
    cp = compiled(tmp_path, """
outputs: [y, r2, g2c]
ops:
  - g1: all_gather(p1, tp, dim=1)
  - g2: all_gather(p2, tp, dim=1)
  - g2c: copy(g2)
  - r1: copy(res)
  - s: all_reduce(g1, tp)
  - y, r2: add_rmsnorm(s, r1, w, inplace=true)
""", H)
    kinds = [d["op"].op for _, d in cp.graph.nodes(data=True)]
    assert "all_reduce_add_rmsnorm" in kinds
    f = cp.report["fuse-collectives"]
    assert f["after"] == 1 and f["buckets"][0]["members"] == ["g1", "g2"], f
    dot, _ = to_dot(cp)
    assert "overwrites r1<" in dot and "overwrites g1" not in dot and "overwrites s" not in dot
