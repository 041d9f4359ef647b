"""Shape/dtype inference of the fp8, norm, activation, rope, all_to_all and multi-result ops,
and the located errors each one gives for misuse."""

import re

import pytest

from planner.shapes import fmt_shape
from tests.planutil import error, load

H = """
plan: t
params:
  hidden: 256
  tp_size: 2
dims:
  num_tokens: 1..16
groups:
  tp: tp_size
inputs:
  x: bf16[num_tokens, hidden]
  r: bf16[num_tokens, hidden]
  xi: int32[num_tokens, 8]
  pos: int64[num_tokens]
  xq: fp8_e4m3[num_tokens, hidden]
  sx_blk: fp32[num_tokens, 2]
  sx_row: fp32[num_tokens, 1]
  cnt: int32[2]
  q: bf16[num_tokens, 4, 32]
  k: bf16[num_tokens, 32]
weights:
  wn: bf16[hidden]
  wq: fp8_e4m3[384, hidden]
  sw_blk: fp32[3, 2]
  sw_col: fp32[384, 1]
  s1: fp32[1]
  w16: bf16[384, hidden]
  cache: fp32[64, 32]
"""


def shape(plan, name):
    t = plan.tensors[name]
    return fmt_shape(t.shape) + " " + t.dtype


@pytest.mark.parametrize("body, name, want", [
    ("y: rmsnorm(x, wn)", "y", "[num_tokens, 256] bf16"),
    ("y: rmsnorm(x, wn, eps='1e-5')", "y", "[num_tokens, 256] bf16"),
    ("y, z: add_rmsnorm(x, r, wn)", "z", "[num_tokens, 256] bf16"),
    ("y: silu_and_mul(x)", "y", "[num_tokens, 128] bf16"),
    ("y: gelu_and_mul(x, approximate=tanh)", "y", "[num_tokens, 128] bf16"),
    ("y: mul(x, x[:, :1])", "y", "[num_tokens, 256] bf16"),
    ("y, z: rope(q, k, pos, cache, interleave=true)", "y", "[num_tokens, 4, 32] bf16"),
    ("y, z: rope(q, k, pos, cache)", "z", "[num_tokens, 32] bf16"),
    ("y, s: quantize(x, fp8_e4m3, block=[1, 128])", "y", "[num_tokens, 256] fp8_e4m3"),
    ("y, s: quantize(x, fp8_e4m3, block=[1, 128])", "s", "[num_tokens, 2] fp32"),
    ("y, s: quantize(x, fp8_e5m2, block=[1, 256])", "s", "[num_tokens, 1] fp32"),
    ("y: gemm(xq, wq, scale_a=sx_blk, scale_b=sw_blk)", "y", "[num_tokens, 384] bf16"),
    ("y: gemm(xq, wq, scale_a=sx_row, scale_b=sw_col, out_dtype=fp32)", "y", "[num_tokens, 384] fp32"),
    ("y: gemm(xq, wq, scale_a=s1, scale_b=s1, out_dtype=fp16)", "y", "[num_tokens, 384] fp16"),
    ("y: gemm(xq, wq, scale_a=sx_row, scale_b=s1)", "y", "[num_tokens, 384] bf16"),
    ("y: all_to_all(x, tp, splits=num_tokens)", None, None),
    ("y: all_to_all(cat(x, x, dim=0), tp, splits=num_tokens)", "y", "[num_tokens + num_tokens, 256] bf16"),
    ("y, c: all_to_all(cat(x, x, dim=0), tp, splits=num_tokens, counts=cnt)", "c", "[2] int32"),
    ("y: all_reduce(x, tp, reduce=avg)", "y", "[num_tokens, 256] bf16"),
    ("y: reduce_scatter(x, tp, dim=1, reduce=avg)", "y", "[num_tokens, 128] bf16"),
    ("a, b: extern(f, x, shapes=[[num_tokens, 8], [4]], dtypes=[fp32, int32])", "a", "[num_tokens, 8] fp32"),
    ("a, b: extern(f, x, shapes=[[num_tokens, 8], [4]], dtypes=[fp32, int32])", "b", "[4] int32"),
    ("a, b: extern(f, x, shapes=[[num_tokens, 8], [4]])", "b", "[4] bf16"),
])
def test_infer(tmp_path, body, name, want):
    out = name or "y"
    text = f"outputs: [{out}]\nops:\n  - {body}\n"
    if name is None:  # x has num_tokens rows, the 2 chunks of splits=num_tokens need 2 * num_tokens
        err = error(tmp_path, text, H)
        assert "2 chunks of splits = num_tokens" in str(err)
        return
    assert shape(load(tmp_path, text, H), name) == want


@pytest.mark.parametrize("body, field, msg", [
    ("y: rmsnorm(x, q)", "q", "must be [256]"),
    ("y: rmsnorm(xi, wn)", "xi", "needs a bf16, fp16 or fp32 input"),
    ("y, z: add_rmsnorm(x, k, wn)", "k", "shape mismatch"),
    ("y: add_rmsnorm(x, r, wn)", "add_rmsnorm", "makes 2 tensors but 1 output name"),
    ("y: silu_and_mul(x[:, :3])", "x[", "must be even"),
    ("y: mul(x, k)", "k", "does not broadcast"),
    ("y, z: rope(q, k, pos, wn)", "wn", "cos_sin_cache 'wn' must be fp32 [max_pos, 32]"),
    ("y, z: rope(q, k, xi, cache)", "xi", "positions 'xi' must be int32/int64 [tokens]"),
    ("y, z: rope(q, x, pos, cache)", "x,", "head dims differ"),
    ("y, s: quantize(x, fp8_e4m3, block=[1, 100])", "[1, 100]", "group size 100 does not divide K = 256"),
    ("y, s: quantize(x, bf16)", "bf16", "quantize makes fp8"),
    ("y: gemm(xq, wq, scale_a=sx_blk, scale_b=sw_col)", "sw_col", "block scales pair with block scales"),
    ("y: gemm(xq, wq, scale_a=sx_blk, scale_b=s1[:1])", "s1[", None),
    ("y: gemm(xq, wq, scale_a=sx_blk, scale_b=sx_blk)", "sx_blk)",
     "scale_b 'sx_blk' is [num_tokens, 2], which does not fit the blocks of 'wq' [384, 256]: expected [1] (per tensor),"
     " [384, 1] (per column) or [3, 2] (128x128 blocks)"),
    ("y: gemm(xq, wq, scale_a=sw_blk, scale_b=sw_blk)", "sw_blk,",
     "expected [1] (per tensor), [num_tokens, 1] (per row) or [num_tokens, 2] (1x128 blocks)"),
    ("y: gemm(xq, wq, scale_a=sx_blk)", "gemm", "needs both scale_a and scale_b"),
    ("y: gemm(x, w16, scale_a=s1, scale_b=s1)", "x,", "need fp8 operands; 'x' is bf16"),
    ("y: gemm(xq, wq, scale_a=s1, scale_b=s1, out_dtype=fp8_e4m3)", "fp8_e4m3)", "gives bf16, fp16 or fp32"),
    ("y: gemm(xq, wq, scale_a=cnt, scale_b=s1)", "cnt", "scales are fp32"),
    ("y: gemm(xq, wq, scale_a=sxx, scale_b=s1)", "sxx", "reads undefined tensor 'sxx'"),
    ("y: gemm(x, wq)", "x,", "'wq' is fp8_e4m3 but 'x' is bf16: an fp8 gemm takes two fp8 operands"),
    ("y: gemm(xq, w16)", "w16", "'xq' is fp8_e4m3 but 'w16' is bf16: an fp8 gemm takes two fp8 operands"),
    ("y: gemm(x, w16, out_dtype=fp8_e4m3)", "fp8_e4m3)", "a bf16 gemm gives bf16, fp16 or fp32, not fp8_e4m3"),
    ("y: gemm(x, w16, out_dtype=int8)", "int8)", "a bf16 gemm gives bf16, fp16 or fp32, not int8"),
    ("y: all_reduce(xi, tp, reduce=avg)", "avg", "reduce=avg needs a floating-point tensor"),
    ("y, c: all_to_all(cat(x, x, dim=0), tp, splits=num_tokens, counts=pos)", "pos", "must be int32/int64 [2]"),
    ("a, b: extern(f, x, shapes=[[4], [4], [4]])", "shapes", "declares 3 results but 2 output name"),
    ("a, b: extern(f, x, shape=[4], shapes=[[4], [4]])", "shape=", "exactly one of shape="),
    ("a, b: extern(f, x, shapes=[[4], [4]], dtypes=[fp32])", "dtypes", "dtypes= has 1 entries"),
    ("a, b: extern(f, x, shapes=[[4], [4]], dtypes=[fp32, fp9])", "dtypes", "unknown dtype 'fp9'"),
])
def test_misuse_is_a_located_error(tmp_path, body, field, msg):
    text = f"outputs: [{body.split(':')[0].split(',')[0]}]\nops:\n  - {body}\n"
    err = error(tmp_path, text, H)
    s = str(err)
    if msg:
        assert msg in s, s
    m = re.search(r"plan\.yaml:(\d+):(\d+):", s)
    assert m, s
    line, col = int(m.group(1)), int(m.group(2))
    src = (tmp_path / "plan.yaml").read_text().splitlines()[line - 1]
    assert line == len(H.strip().splitlines()) + 3  # the op's own line
    assert src[col - 1:].startswith(field) or field in ("gemm", "add_rmsnorm", "shapes", "dtypes", "shape="), (src, col)


def test_inplace_needs_sole_reader_and_made_values(tmp_path):
    base = "outputs: [y, z]\nops:\n  - a: copy(x)\n  - b: copy(r)\n"
    ok = load(tmp_path, base + "  - y, z: add_rmsnorm(a, b, wn, inplace=true)\n", H)
    assert ok.tensors["y"].alias_of == "a" and ok.tensors["z"].alias_of == "b"
    # chained in-place norms: an in-place result may be overwritten again
    ok2 = load(tmp_path, "outputs: [y2, z2]\nops:\n  - a: copy(x)\n  - b: copy(r)\n"
               "  - y, z: add_rmsnorm(a, b, wn, inplace=true)\n  - o: copy(y)\n"
               "  - y2, z2: add_rmsnorm(o, z, wn, inplace=true)\n", H)
    assert ok2.tensors["z2"].alias_of == "z"
    e = error(tmp_path, base + "  - y, z: add_rmsnorm(a, b, wn, inplace=true)\n  - w: add(a, a)\n"
              "outputs: [y, w]\n".replace("outputs: [y, w]\n", ""), H)
    assert "inplace overwrites 'a', which 'w' also reads" in str(e)
    e = error(tmp_path, "outputs: [y]\nops:\n  - y, z: add_rmsnorm(x, r, wn, inplace=true)\n", H)
    assert "'x' is a plan input; only values the plan makes can be overwritten" in str(e)
    e = error(tmp_path, "outputs: [y, a]\nops:\n  - a: copy(x)\n  - b: copy(r)\n"
              "  - y, z: add_rmsnorm(a, b, wn, inplace=true)\n", H)
    assert "overwrites 'a', a plan output" in str(e)
    e = error(tmp_path, "outputs: [y]\nops:\n  - a: copy(x)\n  - b: copy(r)\n"
              "  - y, z: add_rmsnorm(a[:, :256], b, wn, inplace=true)\n", H)
    assert "is a view of 'a'" in str(e)


@pytest.mark.parametrize("dtype, hint", [("fp8", "fp8_e4m3"), ("bfloat61", "bf16"), ("e4m3fn", "fp8_e4m3"),
                                         ("float8_e5m2", None)])
def test_unknown_dtype_lists_valid_ones_and_suggests(tmp_path, dtype, hint):
    head = H.replace("x: bf16[num_tokens, hidden]", f"x: {dtype}[num_tokens, hidden]")
    if hint is None:  # an alias: accepted
        assert load(tmp_path, "outputs: [y]\nops:\n  - y: copy(x)\n", head).tensors["x"].dtype == "fp8_e5m2"
        return
    s = str(error(tmp_path, "outputs: [y]\nops:\n  - y: copy(x)\n", head))
    assert "valid: bf16, fp16, fp32, int32, int64, int8, uint8, fp8_e4m3, fp8_e5m2" in s
    assert f"did you mean '{hint}'?" in s
    s = str(error(tmp_path, f"outputs: [y]\nops:\n  - y: copy(x, dtype={dtype})\n", H))
    assert "valid: bf16" in s and f"did you mean '{hint}'?" in s


def test_cost_model_prices_pointwise_ops_as_bytes_over_bandwidth(tmp_path):
    from planner.cost import CostModel, DeviceProfile, op_signature, split_signature
    plan = load(tmp_path, "outputs: [y, z, g, qq]\nops:\n  - y: rmsnorm(x, wn)\n  - z, _: add_rmsnorm(x, r, wn)\n"
                "  - g: gemm(xq, wq, scale_a=sx_blk, scale_b=sw_blk)\n  - qq, _: rope(q, k, pos, cache)\n", H)
    p = DeviceProfile()
    model = CostModel(p, plan.groups)
    ops = {o.id: o for o in plan.ops}
    b = {"num_tokens": 8}
    us = model.op_us(ops["y"], plan.tensors, b)
    assert us == pytest.approx(p.kernel_us + (8 * 256 * 2 * 2 + 256 * 2) / (p.hbm_gbps * 1e3))
    us2 = model.op_us(ops["z"], plan.tensors, b)   # reads x, r, w; writes two tensors
    assert us2 == pytest.approx(p.kernel_us + (8 * 256 * 2 * 4 + 256 * 2) / (p.hbm_gbps * 1e3))
    g = ops["g"]
    specs = [plan.tensors[n] for n in g.inputs()]
    assert op_signature(g, specs, b) == "gemm:fp8_e4m3:M=8,N=384,K=256,sa=block,sb=block,out=bf16"
    assert split_signature(op_signature(g, specs, b)) == ("gemm", "fp8_e4m3", 8, "N=384,K=256,sa=block,sb=block,out=bf16")
    moved = 8 * 256 + 384 * 256 + 8 * 2 * 4 + 3 * 2 * 4 + 8 * 384 * 2   # fp8 operands, fp32 scales, bf16 out
    assert model.op_us(g, plan.tensors, b) == pytest.approx(p.kernel_us + p.gemm_fixed_us + moved / (p.hbm_gbps * 1e3))
    rope = ops["qq"]
    assert op_signature(rope, [plan.tensors[n] for n in rope.inputs()], b) == "rope:bf16:M=8,q=4x32,k=1x32,il=0"


def test_gate_reads_fp8_dtypes(tmp_path):
    import torch

    from planner.predicates import _tensor_dtype
    assert _tensor_dtype(torch.empty(1, dtype=torch.float8_e4m3fn)) == "fp8_e4m3"
    assert _tensor_dtype(torch.empty(1, dtype=torch.float8_e5m2)) == "fp8_e5m2"
    plan = load(tmp_path, """
outputs: [y]
ops:
  - region: r
    outputs: [y]
    variants:
      - name: fp8
        when: dtype(xq) == fp8_e4m3
        ops:
          y: copy(xq)
      - name: other
        ops:
          y: copy(xq)
""", H.replace("tp_size: 2", "tp_size: 1"))
    assert plan.regions["r"].variants[0].when_src == "dtype(xq) == fp8_e4m3"
    from executors.lowering import build_executor
    from executors.tools.check import make_data
    from planner.pipeline import compile_plan
    ins, w = make_data(plan, {"num_tokens": 3}, 0, 0, "cpu")
    ex = build_executor(compile_plan(plan), w, device="cpu")
    ex(dims={"num_tokens": 3}, **ins)
    assert ex.last_variants == {"r": "fp8"}


def test_quantize_groups_other_than_128_are_not_read_as_blocks(tmp_path):
    """K = 192 in groups of 96 gives scales [T, 2], the shape of 1x128 block scales at that K:
    the gemm would apply them to columns 0..127 and 128..191, not the groups they belong to."""
    head = """
plan: t
dims:
  num_tokens: 1..16
inputs:
  x: bf16[num_tokens, 192]
weights:
  w: fp8_e4m3[64, 192]
  sw: fp32[1, 2]
  sc: fp32[64, 1]
"""
    body = """
outputs: [y]
ops:
  - xq, xs: quantize(x, fp8_e4m3, block=[1, 96])
  - y: gemm(xq, w, scale_a=xs, scale_b=sw)
"""
    d = error(tmp_path, body, head).diagnostics[0]
    assert d.code == "shape" and (d.loc.line, d.loc.col) == (14, 28), d
    assert "scale_a 'xs' holds groups of 96 along K" in d.message and "block=[1, 128]" in d.message
    # one group per row (per-token scales) is what the gemm reads at this K
    load(tmp_path, body.replace("96", "192").replace("scale_b=sw", "scale_b=sc"), head)


# K = 192 in groups of 96 gives the [T, 2] scales that 1x128 blocks give at K = 256
def _scaled_head(k):
    return f"""
plan: t
params:
  tp_size: 2
dims:
  num_tokens: 1..16
groups:
  tp: tp_size
inputs:
  x: bf16[num_tokens, {k}]
weights:
  w: fp8_e4m3[64, {k}]
  sw: fp32[1, 2]
"""


def _groups_refused_and_128_taken(tmp_path, body, read):
    d = error(tmp_path, body, _scaled_head(192)).diagnostics[0]
    assert d.code == "shape" and f"scale_a '{read}' holds groups of 96 along K" in d.message, d
    load(tmp_path, body.replace("96", "128"), _scaled_head(256))  # the blocks the gemm reads


@pytest.mark.parametrize("made,read", [
    ("  - xs2: copy(xs)\n", "xs2"),
    ("  - xs2: xs[:num_tokens]\n", "xs2"),
    ("  - xs2, xs3: split(xs, [1, 1], dim=1)\n  - xs4: cat([xs2, xs3], dim=1)\n", "xs4"),
    ("  - xs2: view(xs, [num_tokens, 2])\n", "xs2"),
    ("  - xs2: shard(xs, tp)\n  - xs3: all_gather(xs2, tp)[:num_tokens]\n", "xs3"),
    ("  - xs2: shard(xs, tp, dim=1)\n  - xs3: all_gather(xs2, tp, dim=1)\n", "xs3"),
])
def test_scale_groups_follow_copies_slices_views_and_gathers(tmp_path, made, read):
    """Scales that went through a copy, slice, split, cat, view or a gather of their rows still hold
    groups of 96."""
    body = f"""
outputs: [y]
ops:
  - xq, xs: quantize(x, fp8_e4m3, block=[1, 96])
{made}  - y: gemm(xq, w, scale_a={read}, scale_b=sw)
"""
    _groups_refused_and_128_taken(tmp_path, body, read)


def test_scale_groups_follow_region_outputs(tmp_path):
    """A region output quantized in groups of 96 is refused at the gemm that reads it as blocks."""
    body = """
outputs: [y]
ops:
  - region: r
    outputs: [xq, xs]
    variants:
      - name: a
        when: num_tokens <= 4
        ops:
          - xq, xs: quantize(x, fp8_e4m3, block=[1, 96])
      - name: b
        ops:
          - xq, xs: quantize(x, fp8_e4m3, block=[1, 96])
  - y: gemm(xq, w, scale_a=xs, scale_b=sw)
"""
    _groups_refused_and_128_taken(tmp_path, body, "xs")


def test_scale_groups_follow_a_view_that_moves_them_to_other_rows(tmp_path):
    """[T, 4] scales of groups of 96 viewed as [2T, 2] beside the fp8 rows viewed alike are still
    groups of 96: read as 1x128 blocks they gave 14 % errors."""
    head = _scaled_head(192).replace("x: bf16[num_tokens, 192]", "x: bf16[num_tokens, 384]")
    body = """
outputs: [y]
ops:
  - q, s: quantize(x, fp8_e4m3, block=[1, 96])
  - q2: view(q, [2 * num_tokens, 192])
  - s2: view(s, [2 * num_tokens, 2])
  - y: gemm(q2, w, scale_a=s2, scale_b=sw)
"""
    d = error(tmp_path, body, head).diagnostics[0]
    assert "scale_a 's2' holds groups of 96 along K" in d.message, d


def test_packed_gathers_of_scales_in_different_groups_still_plan(tmp_path):
    """fuse-collectives packs the two scale gathers into one; the unpacked pieces must not take
    each other's group (validate failed verification with 'holds groups of 512')."""
    p = tmp_path / "p.yaml"
    p.write_text(_scaled_head(256).replace("  sw: fp32[1, 2]\n", """  sw: fp32[1, 2]
  w2: fp8_e4m3[64, 512]
  sw2: fp32[64, 1]
""").replace("inputs:\n", "inputs:\n  x2: bf16[num_tokens, 512]\n") + """
outputs: [y1, y2]
ops:
  - q1, s1: quantize(x, fp8_e4m3, block=[1, 128])
  - q2, s2: quantize(x2, fp8_e4m3, block=[1, 512])
  - s1g: all_gather(s1, tp)
  - s2g: all_gather(s2, tp)
  - y1: gemm(all_gather(q1, tp), w, scale_a=s1g, scale_b=sw)
  - y2: gemm(all_gather(q2, tp), w2, scale_a=s2g, scale_b=sw2)
""")
    from planner.lang.loader import load_plan
    from planner.pipeline import compile_plan
    cp = compile_plan(load_plan(p))
    assert any(d["op"].op == "all_gather" and len(d["op"].fused_from) > 1 for _, d in cp.graph.nodes(data=True))


def test_a_cut_of_per_token_scales_is_still_one_scale_per_row(tmp_path):
    """Per-token scales (one group of K = 256 per row) cut to [T, 1] beside the first 128 columns
    are read right as one scale per row."""
    load(tmp_path, """
outputs: [y]
ops:
  - xq, xs: quantize(x, fp8_e4m3, block=[1, 256])
  - y: gemm(xq[:, :128], w, scale_a=xs[:, :1], scale_b=sw)
""", _scaled_head(256).replace("w: fp8_e4m3[64, 256]", "w: fp8_e4m3[64, 128]").replace("sw: fp32[1, 2]",
                                                                                       "sw: fp32[1, 1]"))


def _group_error(tmp_path, body, head):
    d = error(tmp_path, body, head).diagnostics[0]
    assert d.code == "shape", d
    return d


def test_groups_that_span_k_only_as_one_scale_column(tmp_path):
    """Groups of 256 over K = 512 cut to K = 256 leave two scales a row, read as 1x128 blocks:
    the second block took the scale of the other half of x (errors of 75x)."""
    head = _scaled_head(512).replace("w: fp8_e4m3[64, 512]", "w: fp8_e4m3[64, 256]")
    d = _group_error(tmp_path, """
outputs: [y]
ops:
  - xq, xs: quantize(x, fp8_e4m3, block=[1, 256])
  - y: gemm(xq[:, :256], w, scale_a=xs, scale_b=sw)
""", head)
    assert "scale_a 'xs' holds groups of 256 along K" in d.message and "1x128 blocks" in d.message, d
    assert (d.loc.line, d.loc.col) == (17, 37), d  # at scale_a=xs


def test_scale_b_made_by_quantize_is_checked_for_its_group(tmp_path):
    """A [1, 192] weight quantized in groups of 96 gives [1, 2]: the shape of 128x128 blocks there."""
    head = """
plan: t
dims:
  num_tokens: 1..16
inputs:
  xq: fp8_e4m3[num_tokens, 192]
  xs: fp32[num_tokens, 2]
weights:
  wb: bf16[1, 192]
"""
    body = """
outputs: [y]
ops:
  - wq, ws: quantize(wb, fp8_e4m3, block=[1, 96])
  - y: gemm(xq, wq, scale_a=xs, scale_b=ws)
"""
    d = _group_error(tmp_path, body, head)
    assert "scale_b 'ws' holds groups of 96 along K" in d.message and "128x128 blocks" in d.message, d
    # groups of 128 are the blocks of its one row (K = 256 there)
    load(tmp_path, body.replace("96", "128"), head.replace("192", "256"))


def test_a_cut_of_group_scales_is_not_one_scale_per_row(tmp_path):
    """The first of four 1x128 scales a row, passed as a per-row scale over K = 512."""
    d = _group_error(tmp_path, """
outputs: [y]
ops:
  - xq, xs: quantize(x, fp8_e4m3)
  - y: gemm(xq, w, scale_a=xs[:, :1], scale_b=sc)
""", _scaled_head(512).replace("sw: fp32[1, 2]", "sc: fp32[64, 1]"))
    assert "holds groups of 128 along K" in d.message and "one scale per row over all of K = 512" in d.message, d
