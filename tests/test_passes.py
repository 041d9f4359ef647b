"""Each pass, before and after: what fuses, what splits onto streams, which events, what DCE removes."""

import pytest

from planner.config import CompileConfig
from planner.cost import DeviceProfile
from planner.verify import VerifyError, verify
from tests.planutil import compiled, ops_by_kind

H = """
plan: t
params: {hidden: 64, tp_size: 2}
dims: {num_tokens: 1..4096}
groups: {tp: 2, dp: 2}
inputs:
  x: bf16[num_tokens, hidden]
  y: bf16[num_tokens, hidden]
  z: fp32[num_tokens, hidden]
weights:
  w: bf16[4096, hidden]
  v: bf16[hidden, 4096]
"""


def fusion(cp):
    return cp.report["fuse-collectives"]


def test_independent_gathers_fuse(tmp_path):
    cp = compiled(tmp_path, """
outputs: [a, b, c]
ops:
  - a: all_gather(x, tp)
  - b: all_gather(y, tp)
  - c: all_gather(gemm(x, w), tp)
""", H)
    f = fusion(cp)
    assert f["before"] == 3 and f["after"] == 1
    (b,) = f["buckets"]
    assert b["pack_dim"] == 1 and b["members"] == ["a", "b", "c"]
    # x, y are plan inputs (copied); the gemm writes straight into its slot
    assert b["packing"] == "mixed" and b["tensors"][2] == "c.x"
    assert cp.graph.nodes["c.x"]["out_slot"][0] == "all_gather.fused0.packed"
    kinds = ops_by_kind(cp)
    assert len(kinds["all_gather"]) == 1 and kinds["cat"] == ["all_gather.fused0.pack"]


def test_path_between_prevents_fusion(tmp_path):
    cp = compiled(tmp_path, """
outputs: [b]
ops:
  - a: all_gather(x, tp)
  - b: all_gather(gemm(a, w)[:num_tokens, :64], tp)
""", H)
    f = fusion(cp)
    assert f["after"] == 2 and not f["buckets"]
    assert "path between" in f["not_fused"][0]["reason"]


@pytest.mark.parametrize("second, why", [
    ("all_gather(y, dp)", "process group"),
    ("all_gather(z, tp)", "dtype"),
    ("all_gather(y, tp, dim=1)", "dim"),
    ("reduce_scatter(pad(y, 2), tp)", "kind"),
])
def test_unsafe_merges_refused_with_reason(tmp_path, second, why):
    cp = compiled(tmp_path, f"""
outputs: [a, b]
ops:
  - a: all_gather(x, tp)
  - b: {second}
""", H)
    f = fusion(cp)
    assert not f["buckets"]
    if why != "kind":
        assert why in f["not_fused"][0]["reason"]


def test_collectives_in_exclusive_variants_do_not_fuse(tmp_path):
    cp = compiled(tmp_path, """
outputs: [a, b]
ops:
  - a: all_gather(x, tp)
  - region: r
    outputs: [b]
    variants:
      - name: big
        when: num_tokens > 64
        ops:
          - b: all_gather(y, tp)
      - name: small
        ops:
          - b: all_gather(copy(y), tp)
""", H)
    f = fusion(cp)
    assert not f["buckets"]
    assert any("variants" in n["reason"] for n in f["not_fused"])


def test_byte_cap(tmp_path):
    body = """
outputs: [a, b]
ops:
  - a: all_gather(x, tp)
  - b: all_gather(y, tp)
"""
    assert fusion(compiled(tmp_path, body, H))["after"] == 1
    cfg = CompileConfig(bucket_cap_mb=0.6, verify_each=True)  # one member is 0.5 MB at 4096 tokens
    f = fusion(compiled(tmp_path, body, H, cfg=cfg))
    assert f["after"] == 2 and "byte cap" in f["not_fused"][0]["reason"]


def test_fusion_that_delays_the_critical_path_is_refused(tmp_path):
    # a's result feeds a long chain at once; b's input is ready only after 500 us of work:
    # one packed gather would hold the chain back
    cp = compiled(tmp_path, """
outputs: [out, b]
ops:
  - a: all_gather(x, tp)
  - out: extern(long_chain, a, shape=[num_tokens, hidden], cost_us=800)
  - late: extern(slow_producer, y, shape=[num_tokens, hidden], cost_us=500)
  - b: all_gather(late, tp)
""", H)
    f = fusion(cp)
    assert f["after"] == 2
    assert "critical path" in f["not_fused"][0]["reason"]


def test_reduce_scatter_and_all_reduce_buckets(tmp_path):
    cp = compiled(tmp_path, """
outputs: [a, b, c, d]
ops:
  - a: reduce_scatter(pad(x, 2), tp)
  - b: reduce_scatter(pad(y, 2), tp)
  - c: all_reduce(gemm(x, w), tp)
  - d: all_reduce(gemm(y, w), tp)
""", H)
    f = fusion(cp)
    kinds = sorted(b["kind"] for b in f["buckets"])
    assert kinds == ["all_reduce", "reduce_scatter"] and f["before"] == 4 and f["after"] == 2
    ar = next(b for b in f["buckets"] if b["kind"] == "all_reduce")
    assert ar["packing"] == "inplace"  # both producers are gemms


def test_two_branches_split_onto_two_streams_with_events(tmp_path):
    cp = compiled(tmp_path, """
outputs: [big, small]
ops:
  - big: gemm(x, w)
  - small: gemm(gemm(x, w[:64]), v[:, :64])
""", H)
    g = cp.graph
    streams = {v: g.nodes[v]["stream"] for v in g.nodes}
    assert streams["big"] != streams["small"] and set(streams.values()) == {"main", "aux"}
    chain = [v for v in cp.schedule if g.nodes[v]["op"].op == "gemm" and v != "big"]
    assert len(chain) == 2 and streams[chain[0]] == streams[chain[1]]
    # a fork wait only where the aux stream first reads the caller's inputs; one join at exit
    aux_ops = [v for v in cp.schedule if streams[v] == "aux" and g.nodes[v]["op"].op == "gemm"]
    assert g.nodes[aux_ops[0]]["waits"] == ["entry"]
    assert all(not g.nodes[v]["waits"] for v in aux_ops[1:])
    assert len(cp.exit_waits) == 1
    verify(cp)


def test_split_refused_when_fork_join_does_not_pay(tmp_path):
    body = """
outputs: [a, b]
ops:
  - a: gemm(x, w[:64])
  - b: gemm(y, w[64:128])
"""
    cfg = CompileConfig(profile=DeviceProfile(event_us=20.0), verify_each=True)
    cp = compiled(tmp_path, body, H, cfg=cfg)
    assert {cp.graph.nodes[v]["stream"] for v in cp.graph.nodes} == {"main"}
    dec = " ".join(d["decision"] for d in cp.report["assign-streams"])
    # refused, and the report says why
    assert "slower than serial" in dec or "does not pay" in dec or "single stream" in dec, dec
    cp = compiled(tmp_path, body, H)
    assert {cp.graph.nodes[v]["stream"] for v in cp.graph.nodes} == {"main", "aux"}


def test_pinned_stream_and_single_stream_pool(tmp_path):
    body = """
streams: [main, comm]
outputs: [a, b]
ops:
  - a: gemm(x, w, stream=comm)
  - b: gemm(y, w)
"""
    cp = compiled(tmp_path, body, H)
    assert cp.graph.nodes["a"]["stream"] == "comm" and "comm" in cp.streams
    cp = compiled(tmp_path, body.replace(", stream=comm", ""), H, cfg=CompileConfig(num_streams=1, verify_each=True))
    assert cp.streams == ["main"] and not cp.events


def test_collectives_and_main_only_externs_stay_on_main(tmp_path):
    cp = compiled(tmp_path, """
outputs: [a, b, c]
ops:
  - a: all_reduce(gemm(x, w), tp)
  - b: extern(moe, y, shape=[num_tokens, hidden], cost_us=50, side_stream=false)
  - c: gemm(gemm(y, w), v)
""", H)
    g = cp.graph
    assert g.nodes["a"]["stream"] == "main" and g.nodes["b"]["stream"] == "main"
    # the shared-expert-like gemm chain overlaps the opaque MoE
    assert g.nodes["c"]["stream"] == "aux"


def test_dce_removes_static_false_variant_and_unused_ops(tmp_path):
    cp = compiled(tmp_path, """
outputs: [a]
ops:
  - unused: gemm(y, w)
  - region: r
    outputs: [a]
    variants:
      - name: tp8_only
        when: tp_size == 8 and capturing
        ops:
          - a: copy(x)
      - name: generic
        ops:
          - a: add(x, x)
""", H)
    assert "unused" not in cp.graph
    assert [v.name for v in cp.variants["r"]] == ["generic"]
    assert any("tp8_only" in n for n in cp.report["dce"])


def test_two_fused_gathers_that_need_each_others_results_are_not_both_packed(tmp_path):
    """a1 + a2 (over tp) and b1 + b2 (over dp) are each free of paths, but a1 feeds b2 and b1
    feeds a2: packing both would be a cycle (compile crashed in the stream pass). The earlier
    bucket is packed; the other is listed with the reason."""
    h = H.replace("v: bf16[hidden, 4096]", "v: bf16[hidden, 4096]\n  wbig: bf16[4194304, hidden]")
    cp = compiled(tmp_path, """
outputs: [a2, b2, big]
ops:
  - big: gemm(x, wbig)
  - a1: all_gather(x, tp)
  - b1: all_gather(x, dp)
  - fa: gemm(b1[:num_tokens], v[:, :hidden])
  - a2: all_gather(fa, tp)
  - fb: gemm(a1[:num_tokens], v[:, :hidden])
  - b2: all_gather(fb, dp)
""", h)
    f = fusion(cp)
    assert [b["members"] for b in f["buckets"]] == [["a1", "a2"]]
    assert any(n["ops"] == ["b1", "b2"] and "a cycle" in n["reason"] for n in f["not_fused"])


def test_memory_estimate(tmp_path):
    cp = compiled(tmp_path, """
outputs: [c]
ops:
  - a: gemm(x, w)
  - b: gemm(a, v)
  - c: add(b, x)
""", H)
    m = cp.report["estimate-memory"]["variants"]["(plan)"]
    # a [4096, 4096] bf16 (32 MiB) is live while b [4096, 64] is made
    assert m["peak_bytes"] == 4096 * 4096 * 2 + 4096 * 64 * 2
    assert m["peak_at"] == "b"


def test_memory_of_a_region_output_is_the_chosen_variants_value(tmp_path):
    """A region output is the value of the variant that ran (the executor binds that tensor): the
    select adds no storage, and the other variant's values are not made in that call."""
    cp = compiled(tmp_path, """
outputs: [o]
ops:
  - region: r
    outputs: [o]
    variants:
      - name: small
        when: num_tokens <= 64
        ops:
          - a: gemm(x, w)
          - o: add(a, a)
      - name: big
        ops:
          - a: gemm(x, w)
          - o: copy(a)
""", H)
    mem = cp.report["estimate-memory"]["variants"]
    row = 4096 * 2  # one [1, 4096] bf16 row
    assert mem["big"]["bindings"] == {"num_tokens": 4096}
    assert mem["big"]["peak_bytes"] == 2 * 4096 * row        # a and o, nothing for the select
    assert mem["small"]["peak_bytes"] == 2 * 64 * row
    assert mem["big"]["peak_at"] == "r/big/o"


def test_verify_catches_broken_invariants(tmp_path):
    body = """
outputs: [c]
ops:
  - a: gemm(x, w)
  - b: gemm(gemm(y, w[:64]), v[:, :64])
  - c: add(a[:, :64], b)
"""
    cp = compiled(tmp_path, body, H)
    assert any(cp.graph.nodes[v]["waits"] not in ([], ["entry"]) for v in cp.graph.nodes)
    for v in cp.graph.nodes:
        cp.graph.nodes[v]["waits"] = [e for e in cp.graph.nodes[v]["waits"] if e == "entry"]
    with pytest.raises(VerifyError, match="without an event"):
        verify(cp)
    cp = compiled(tmp_path, body.replace("c: add(a[:, :64], b)", "c: copy(a)").replace("outputs: [c]", "outputs: [c, b]"), H)
    assert cp.exit_waits
    cp.exit_waits = []
    with pytest.raises(VerifyError, match="not joined"):
        verify(cp)
    cp2 = compiled(tmp_path, "outputs: [a]\nops:\n  - a: gemm(x, w)\n", H)
    cp2.schedule = list(reversed(cp2.schedule)) + ["nonexistent"]
    with pytest.raises(VerifyError):
        verify(cp2)


def test_unprofitable_fusion_is_refused(tmp_path):
    body = """
outputs: [a, b]
ops:
  - a: all_gather(x, tp)
  - b: all_gather(y, tp)
"""
    # with (almost) free collective launches, packing only adds the cat copy of two plan inputs
    cfg = CompileConfig(profile=DeviceProfile(coll_latency_us=0.1), verify_each=True)
    f = fusion(compiled(tmp_path, body, H, cfg=cfg))
    assert f["after"] == 2 and "unprofitable" in f["not_fused"][-1]["reason"]
    f = fusion(compiled(tmp_path, body, H))
    assert f["after"] == 1 and f["buckets"][0]["estimate"]["packed_us"] < f["buckets"][0]["estimate"]["separate_us"]


@pytest.mark.parametrize("factor, form", [(1.05, "inplace"), (1.83, "cat")])
def test_zero_copy_follows_the_strided_write_cost(tmp_path, factor, form):
    body = """
outputs: [a, b]
ops:
  - a: all_gather(add(x, x), tp)
  - b: all_gather(add(y, y), tp)
"""
    cfg = CompileConfig(profile=DeviceProfile(strided_write_factor=factor), verify_each=True)
    (b,) = fusion(compiled(tmp_path, body, H, cfg=cfg))["buckets"]
    assert b["packing"] == form, b["why"]
