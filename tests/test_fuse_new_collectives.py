"""fuse-collectives with reduce=avg and all_to_all: never across reductions; all_to_all never fused."""

from tests.planutil import compiled, ops_by_kind

H = """
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
  y: bf16[num_tokens, hidden]
  z: bf16[num_tokens, hidden]
"""


def fusion(cp):
    return cp.report["fuse-collectives"]


def test_avg_and_sum_do_not_merge_but_two_avgs_do(tmp_path):
    cp = compiled(tmp_path, """
outputs: [a, b, c]
ops:
  - a: all_reduce(x, tp, reduce=avg)
  - b: all_reduce(y, tp, reduce=avg)
  - c: all_reduce(z, tp)
""", H)
    f = fusion(cp)
    assert [b["members"] for b in f["buckets"]] == [["a", "b"]]
    assert any("reduction (avg vs sum)" in n["reason"] for n in f["not_fused"])
    fused = cp.graph.nodes[f["buckets"][0]["id"]]["op"]
    assert fused.op == "all_reduce" and fused.reduce == "avg"


def test_all_to_all_is_never_fused(tmp_path):
    cp = compiled(tmp_path, """
outputs: [a, b]
ops:
  - a: all_to_all(cat(x, y, dim=0), tp, splits=num_tokens)
  - b: all_to_all(cat(y, z, dim=0), tp, splits=num_tokens)
""", H)
    f = fusion(cp)
    assert not f["buckets"] and f["before"] == f["after"] == 2
    assert len(ops_by_kind(cp)["all_to_all"]) == 2
    assert [n["ops"][0] for n in f["not_fused"]] == ["a", "b"]
    assert all("all_to_all is never fused" in n["reason"] for n in f["not_fused"])
    # and it stays on the main stream with the other collectives
    assert all(cp.graph.nodes[v]["stream"] == "main" for v in ("a", "b"))


def test_refusal_reason_tells_exclusive_variants_from_a_gated_and_an_ungated_collective(tmp_path):
    """Two variants of one region never run together; a collective inside a variant and one
    outside the region can: the report says which (it called both 'exclusive at run time')."""
    from tests.planutil import compiled

    cp = compiled(tmp_path, """
outputs: [ga, gb]
ops:
  - region: r
    outputs: [ga]
    variants:
      - name: small
        when: num_tokens <= 8
        ops:
          - ga: all_gather(x, tp, 0)
      - name: big
        ops:
          - a2: add(x, x)
          - ga: all_gather(a2, tp, 0)
  - gb: all_gather(x, tp, 0)
""")
    why = {tuple(d["ops"]): d["reason"] for d in cp.report["fuse-collectives"]["not_fused"]}
    assert why[("r/small/ga", "r/big/ga")] == "different variants (exclusive at run time)"
    assert why[("r/small/ga", "gb")].startswith("different variant contexts (r:small vs every call)")
    assert "can run in one call" in why[("r/big/ga", "gb")]
