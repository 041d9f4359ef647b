"""fuse-collectives: readers that need a packed result whole, and slack under the comm order.

A packed member's result is a piece of the packed result (strided unless cut along dim 0): a
reader that needs it contiguous makes the pass pack along a dim that keeps it whole, copy it out,
or leave the member out, whichever the cost model rates best. Collectives on one stream run one
after another, so a member that waits for an earlier one is not delayed by packing with it, and a
delay within the tolerance is a tie.
"""

import pytest

from planner.config import CompileConfig
from planner.cost import DeviceProfile
from tests.planutil import compiled, ops_by_kind, write

H = """
plan: t
dims:
  num_tokens: 1..16
groups:
  tp: 2
inputs:
  k: bf16[num_tokens, 64]
  v: bf16[num_tokens, 64]
  u: bf16[num_tokens, 64]
"""


def fusion(cp):
    return cp.report["fuse-collectives"]


def test_a_view_of_a_packed_result_reads_a_contiguous_copy(tmp_path):
    body = """
outputs: [k_heads, v_full]
ops:
  - k_full: all_gather(k, tp)
  - v_full: all_gather(v, tp)
  - k_heads: view(k_full, [num_tokens * 2, 4, 16])
"""
    cp = compiled(tmp_path, body, H)  # verified after every pass
    (b,) = fusion(cp)["buckets"]
    assert b["members"] == ["k_full", "v_full"] and b["pack_dim"] == 1
    assert b["unpack_copies"] == [{"tensor": "k_full", "why": "view 'k_heads' needs 'k_full' contiguous"}]
    assert "copied out of the packed result: k_full (view 'k_heads' needs 'k_full' contiguous)" in b["why"]
    (copy,) = ops_by_kind(cp)["copy"]
    op = cp.graph.nodes[copy]["op"]
    assert op.out == ["k_full"] and cp.tensors[op.x].alias_of == b["id"] + ".out"
    assert cp.tensors["k_full"].contiguous and cp.tensors["k_full"].alias_of is None
    assert not cp.tensors["v_full"].contiguous  # the other piece stays a view: nothing needs it whole
    # the copy is in the estimate: one small kernel more than the same bucket without the view
    plain = fusion(compiled(tmp_path, body.replace("k_heads, v_full]", "k_full, v_full]").split("  - k_heads")[0], H))
    extra = b["estimate"]["packed_us"] - plain["buckets"][0]["estimate"]["packed_us"]
    assert 1.0 <= extra < 1.1


@pytest.mark.parametrize("body, result, why", [
    ("""
outputs: [u_flat, v_full]
ops:
  - u_full: all_gather(u, tp)[:num_tokens]
  - v_full: all_gather(v, tp)
  - u_flat: view(u_full, [num_tokens * 64])
""", "u_full.src", "view 'u_flat' needs 'u_full' contiguous"),
    ("""
outputs: [y, v_full]
ops:
  - k_full: all_gather(k, tp)
  - v_full: all_gather(v, tp)
  - region: r
    outputs: [y]
    variants:
      - name: a
        when: contiguous(k_full)
        ops:
          - y: copy(k_full)
      - name: b
        ops:
          - y: add(k_full, k_full)
""", "k_full", "the gate of variant 'a' of region 'r' asks contiguous(k_full)"),
    ("""
weights:
  nw: bf16[64]
outputs: [n, rr, vv]
ops:
  - region: g
    outputs: [kk, vv]
    variants:
      - name: small
        when: num_tokens <= 8
        ops:
          - kk: all_gather(k, tp)
          - vv: all_gather(v, tp)
      - name: big
        ops:
          - kk: copy(all_gather(k, tp))
          - vv: copy(all_gather(v, tp))
  - n, rr: add_rmsnorm(kk, copy(all_gather(u, tp)), nw, inplace=true)
""", "g/small/kk", "add_rmsnorm 'n' needs 'kk' contiguous"),
], ids=["view-of-a-slice", "gate", "inplace-norm-of-a-region-output"])
def test_readers_that_need_a_result_whole_are_found_through_views_and_gates(tmp_path, body, result, why):
    f = fusion(compiled(tmp_path, body, H))
    copies = [c for b in f["buckets"] for c in b["unpack_copies"]]
    assert {"tensor": result, "why": why} in copies, f


def test_a_pack_dim_that_keeps_the_result_whole_is_preferred(tmp_path):
    cp = compiled(tmp_path, """
outputs: [kf, v_sum]
ops:
  - k_sum: all_reduce(k, tp)
  - v_sum: all_reduce(v, tp)
  - kf: view(k_sum, [num_tokens * 64])
""", H)
    (b,) = fusion(cp)["buckets"]
    assert b["pack_dim"] == 0 and b["unpack_copies"] == []
    assert "packed along dim 0, not 1, so that k_sum stays whole (view 'kf' needs 'k_sum' contiguous)" in b["why"]
    assert "copy" not in ops_by_kind(cp)


def test_a_member_is_left_out_when_its_copy_costs_more_than_its_collective(tmp_path):
    body = """
weights:
  w1: bf16[64, 64]
  w2: bf16[64, 64]
  w3: bf16[64, 64]
outputs: [ga, gb, vc]
ops:
  - a: gemm(k, w1)
  - b: gemm(k, w2)
  - c: gemm(k, w3)
  - ga: all_gather(a, tp)
  - gb: all_gather(b, tp)
  - gc: all_gather(c, tp)
  - vc: view(gc, [num_tokens * 2 * 64])
"""
    (b,) = fusion(compiled(tmp_path, body, H))["buckets"]  # a copy costs 1 us: all three packed
    assert b["members"] == ["ga", "gb", "gc"] and b["unpack_copies"][0]["tensor"] == "gc"
    # a 30 us kernel launch makes the copy dearer than gc's own gather
    cfg = CompileConfig(profile=DeviceProfile(kernel_us=30.0), verify_each=True)
    f = fusion(compiled(tmp_path, body, H, cfg=cfg))
    (b,) = f["buckets"]
    assert b["members"] == ["ga", "gb"] and b["unpack_copies"] == []
    (nf,) = [n for n in f["not_fused"] if n["ops"][0] == "gc"]
    assert nf["reason"].startswith("left out of the packed all_gather: its result 'gc' would be a view of the"
                                   " packed result, but view 'vc' needs 'gc' contiguous")


def test_run_check_passes_with_views_of_packed_results(tmp_path, capsys):
    from planner.cli import main
    path = write(tmp_path, H.lstrip("\n") + """
outputs: [k_heads, u_flat, v_full]
ops:
  - k_full: all_gather(k, tp)
  - u_full: all_gather(u, tp)[:num_tokens]
  - v_full: all_gather(v, tp)
  - k_heads: view(k_full, [num_tokens * 2, 4, 16])
  - u_flat: view(u_full, [num_tokens * 64])
""")
    rc = main(["run", str(path), "--check", "--num-tokens", "3"])
    out = capsys.readouterr().out
    assert rc == 0 and "result: OK (3 outputs x 2 rank(s))" in out, out


SLACK = """
plan: t
dims:
  num_tokens: 1..16
groups:
  tp: 2
inputs:
  x: bf16[num_tokens, 64]
  y: bf16[num_tokens, 64]
weights:
  w1: bf16[{n}, 64]
"""


@pytest.mark.parametrize("n", [32, 64])
@pytest.mark.parametrize("order", ["ra first", "rs first"])
def test_a_member_waiting_for_the_other_in_comm_order_is_not_delayed(tmp_path, n, order):
    ra, rs = "  - ra: all_reduce(a, tp)\n", "  - rs: all_reduce(s, tp)\n"
    body = "outputs: [ra, rs]\nops:\n  - a: gemm(x, w1)\n  - s: add(x, y)\n" + (ra + rs if order == "ra first" else rs + ra)
    f = fusion(compiled(tmp_path, body, SLACK.replace("{n}", str(n))))
    assert f["after"] == 1, f["not_fused"]
    assert f["buckets"][0]["estimate"]["packed_us"] < f["buckets"][0]["estimate"]["separate_us"]


def test_a_delay_within_the_tolerance_is_a_tie(tmp_path):
    # two quantizes whose costs differ by picoseconds: the old check refused the pack over
    # "a 0.0 us delay (slack -0.0 us)"
    cp = compiled(tmp_path, """
outputs: [y, y2]
ops:
  - xq, xs: quantize(x, fp8_e4m3, block=[1, 128])
  - x2q, x2s: quantize(x2, fp8_e4m3, block=[1, hidden])
  - xq_full: all_gather(xq, tp)[:num_tokens]
  - xs_full: all_gather(xs, tp)[:num_tokens]
  - x2q_full: all_gather(x2q, tp)[:num_tokens]
  - x2s_full: all_gather(x2s, tp)[:num_tokens]
  - y: gemm(xq_full, w, scale_a=xs_full, scale_b=sw)
  - y2: gemm(x2q_full, w2, scale_a=x2s_full, scale_b=sw2, out_dtype=fp32)
""", """
plan: fp8_sp
params:
  hidden: 256
  inter: 256
  tp_size: 2
dims:
  num_tokens: 1..32
groups:
  tp: tp_size
inputs:
  x: bf16[ceil_div(num_tokens, tp_size), hidden]
  x2: bf16[ceil_div(num_tokens, tp_size), hidden]
weights:
  w: fp8_e4m3[inter, hidden]
  sw: fp32[ceil_div(inter, 128), ceil_div(hidden, 128)]
  w2: fp8_e4m3[inter, hidden]
  sw2: fp32[inter, 1]
""")
    f = fusion(cp)
    assert f["before"] == 4 and f["after"] == 2, f["not_fused"]
    assert [b["members"] for b in f["buckets"]] == [["xq_full.src", "x2q_full.src"], ["xs_full.src", "x2s_full.src"]]


@pytest.mark.parametrize("late_us, fused", [(0.1, True), (0.5, False)])
def test_a_real_delay_is_refused_and_reported_in_hundredths(tmp_path, late_us, fused):
    # a's result feeds the critical path at once; b's input comes late_us later
    f = fusion(compiled(tmp_path, f"""
outputs: [out, b]
ops:
  - a: all_gather(k, tp)
  - out: extern(long_chain, a, shape=[num_tokens * 2, 64], cost_us=800)
  - late: extern(slow_producer, v, shape=[num_tokens, 64], cost_us='{late_us}')
  - b: all_gather(late, tp)
""", H))
    assert (f["after"] == 1) == fused, f["not_fused"]
    if not fused:
        assert f["not_fused"][0]["reason"] == "would delay a by 0.50 us on the critical path (slack 0.00 us)"


def test_an_input_already_written_into_an_earlier_buckets_slot_is_copied(tmp_path):
    # layouts are chosen before any bucket is rewritten: the second bucket must not move a's slot
    f = fusion(compiled(tmp_path, """
weights:
  w1: bf16[64, 64]
  w2: bf16[64, 64]
  w3: bf16[64, 64]
outputs: [ga, gb, da, dc]
ops:
  - a: gemm(k, w1)
  - b: gemm(k, w2)
  - c: gemm(k, w3)
  - ga: all_gather(a, tp)
  - gb: all_gather(b, tp)
  - da: all_gather(a, dp)
  - dc: all_gather(c, dp)
""", H.replace("  tp: 2\n", "  tp: 2\n  dp: 2\n")))
    assert [b["packing"] for b in f["buckets"]] == ["inplace", "mixed"]
    assert f["buckets"][1]["why"] == "1 of 2 written in place (c); copied: a (views of other tensors)"


def test_model_code_reading_a_packed_result_gets_it_whole(tmp_path):
    """An extern was written for the whole tensor the plan gives it (it may view it, or hand it to
    a kernel that needs it contiguous): its result is copied out of the packed one."""
    cp = compiled(tmp_path, """
outputs: [q_full, k_rot]
ops:
  - q_full: all_gather(k, tp)
  - k_full: all_gather(v, tp)
  - k_rot: extern(rope_like, k_full, shape=[num_tokens * 2, 64])
""", H)
    (b,) = fusion(cp)["buckets"]
    assert [u["tensor"] for u in b["unpack_copies"]] == ["k_full"], b
    assert "model code 'k_rot' (rope_like) is given 'k_full'" in b["unpack_copies"][0]["why"]
    assert not cp.tensors["q_full"].contiguous  # a plan output stays a view (documented)


def test_shards_and_gates_of_packed_results_run_as_written(tmp_path, capsys):
    """A shard of a packed piece is a view of a strided tensor: the executor hands it over
    contiguous as the plan declares, so a view of it runs and a contiguous() gate picks the
    variant the reference picks (it crashed in view / picked the other variant)."""
    from planner.cli import main
    path = write(tmp_path, H.lstrip("\n") + """
outputs: [y, heads, vf]
ops:
  - kf: all_gather(k, tp, dim=1)
  - vf: all_gather(v, tp, dim=1)
  - ks: shard(kf, tp)
  - heads: view(ks, [ceil_div(num_tokens, 2), 8, 16])
  - region: r
    outputs: [y]
    variants:
      - name: fast
        when: contiguous(ks)
        ops:
          - y: copy(ks)
      - name: slow
        ops:
          - y: copy(ks, dtype=bf16)
""")
    for n in ("8", "3"):
        rc = main(["run", str(path), "--check", "--num-tokens", n])
        out = capsys.readouterr().out
        assert rc == 0 and "result: OK (3 outputs x 2 rank(s))" in out, out
