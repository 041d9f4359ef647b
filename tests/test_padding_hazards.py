"""Results that depend on rows padded past the real ones (planner.hazards.padding_sensitive): a
graph captured at a bucket replays smaller sizes on padded rows and slices the results back, so a
layout whose real rows are not the leading ones gives wrong rows. Refused in capture-gated
variants at compile time; GraphedExecutor refuses a padded call of such a plan (GPU tests)."""

import pytest

from planner.hazards import HazardError, padding_sensitive
from tests.planutil import compiled

H = """
plan: t
dims: {num_tokens: 1..64}
groups: {tp: 2}
inputs:
  x: bf16[num_tokens, 64]
  xt: bf16[64, num_tokens]
  yt: bf16[32, num_tokens]
weights:
  w: bf16[64, 64]
"""


@pytest.mark.parametrize("ops, out, hit", [
    ("  - y: all_gather(x, tp)\n", "y", "y"),
    ("  - g: all_gather(x, tp)\n  - y: copy(gemm(g, w))\n", "y", "g"),       # followed through row-wise work
    ("  - y: all_gather(x, tp)[:num_tokens]\n", "y", None),                   # rank 0's block: its real rows lead
    ("  - y: all_gather(x, tp, dim=1)\n", "y", None),                         # along the features
    ("  - s: shard(x, tp)\n  - y: all_gather(gemm(s, w), tp)[:num_tokens]\n", "y", None),  # the SP round trip
    ("  - s: shard(x, tp)\n  - y: all_gather(gemm(s, w), tp)\n", "y", None),  # chunks gathered back in order
    ("  - y: shard(x, tp)\n", "y", "y"),                                      # a bucket-sized chunk
    ("  - y: cat(x, x, dim=0)\n", "y", "y"),
    ("  - y: cat(x, x, dim=1)\n", "y", None),
    ("  - y: gemm(xt, yt)\n", "y", "y"),                                      # sums over the padded rows
    ("  - g: all_gather(x, tp)\n  - y: extern(f, g, shape=[num_tokens, 64])\n", "y", None),  # model code trusted
])
def test_what_depends_on_padded_rows(tmp_path, ops, out, hit):
    cp = compiled(tmp_path, f"outputs: [{out}]\nops:\n{ops}", H)
    got = padding_sensitive(cp)
    if hit is None:
        assert got == {}, got
    else:
        assert hit in got, got


def test_a_gather_in_a_capture_only_variant_is_a_located_error(tmp_path):
    with pytest.raises(HazardError) as ei:
        compiled(tmp_path, """
outputs: [y]
ops:
  - region: r
    outputs: [y]
    variants:
      - name: graph
        when: capturing
        ops:
          - y: all_gather(x, tp)
      - name: eager
        ops:
          - y: all_gather(copy(x), tp)
""", H)
    d = ei.value.diagnostics[0]
    assert d.code == "variant" and "all_gather r/graph/y lays blocks of num_tokens rows" in d.message, d
    assert d.loc.line == 19, d
    # sliced back to rank 0's rows it is fine, as the eager variant is
    compiled(tmp_path, """
outputs: [y]
ops:
  - region: r
    outputs: [y]
    variants:
      - name: graph
        when: capturing
        ops:
          - y: all_gather(x, tp)[:num_tokens]
      - name: eager
        ops:
          - y: copy(x)
""", H)


def test_model_code_after_an_all_to_all_is_trusted(tmp_path):
    """EP dispatch / combine: the chunks go to model code that knows their counts."""
    cp = compiled(tmp_path, """
outputs: [y]
ops:
  - send, cnt: extern(pack, x, shapes=[[2 * num_tokens, 64], [2]], dtypes=[bf16, int32])
  - recv, rc: all_to_all(send, tp, splits=num_tokens, counts=cnt)
  - back: all_to_all(extern(experts, recv, rc, shape=[2 * num_tokens, 64]), tp, splits=num_tokens)
  - y: extern(unpack, back, shape=[num_tokens, 64])
""", H)
    assert padding_sensitive(cp) == {}
