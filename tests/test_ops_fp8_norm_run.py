"""Running the new ops: compiled == reference under `planner run --check` on CPU, the torch
implementations against independent fp32 formulas (fp8 after dequantization, tolerances
stated below), backend capability reasons, multi-result externs, and tune's CPU dry run."""

from __future__ import annotations

import math

import pytest
import torch

from executors.backends import lookup
from executors.backends.registry import UnsupportedOp
from executors.backends.torch_fp8 import dequantize, gemm_fp8_reference, quantize_reference
from executors.backends.torch_pointwise import add_rmsnorm_ref, gated_ref, rmsnorm_ref, rope_ref
from executors.lowering import build_executor
from executors.tools.check import make_data, run_check
from executors.tools.externs import default_externs
from planner.cli import main
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan
from tests.planutil import write

PLAN = """
plan: ops
params:
  hidden: 256
dims:
  num_tokens: 1..16
inputs:
  x: bf16[num_tokens, hidden]
  res: bf16[num_tokens, hidden]
  pos: int64[num_tokens]
weights:
  wn: bf16[hidden]
  wq: fp8_e4m3[384, hidden]
  sq: fp32[3, 2]
  wt: fp8_e5m2[128, hidden]
  st: fp32[1]
  wc: fp8_e4m3[128, hidden]
  sc: fp32[128, 1]
  wg: bf16[512, hidden]
  cache: fp32[64, 32]
outputs: [h, r2, y, yt, yc, act, gel, qr, kr, a, b, prod, xq, sx]
ops:
  - r1: add(x, res)
  - h0: copy(x)
  - h, r2: add_rmsnorm(h0, r1, wn, inplace=true)
  - xq, sx: quantize(h, fp8_e4m3, block=[1, 128])
  - y: gemm(xq, wq, scale_a=sx, scale_b=sq)
  - xt, st_x: quantize(h, fp8_e5m2, block=[1, 256])
  - yt: gemm(xt, wt, scale_a=st_x, scale_b=st)
  - xr, sr: quantize(h, fp8_e4m3, block=[1, 256])         # per token
  - yc: gemm(xr, wc, scale_a=sr, scale_b=sc, out_dtype=fp32)
  - gu: gemm(rmsnorm(x, wn), wg)
  - act: silu_and_mul(gu)
  - gel: gelu_and_mul(gu, approximate=tanh)
  - prod: mul(act, act[:, :1])
  - qv: view(copy(y[:, :256]), [num_tokens, 8, 32])
  - qr, kr: rope(qv, y[:, 256:288], pos, cache, interleave=true)
  - a, b: extern(routed, h, shapes=[[num_tokens, hidden], [num_tokens, 8]], dtypes=[bf16, int32])
"""


@pytest.fixture
def plan_path(tmp_path):
    return write(tmp_path, PLAN, "ops.yaml")


def test_compiled_matches_reference_on_cpu(plan_path):
    rep = run_check(lambda: load_plan(plan_path), num_tokens=13, seed=3)
    assert rep["ok"], rep["outputs"]
    assert {o["name"] for o in rep["outputs"]} == set(load_plan(plan_path).outputs)
    # fp8 outputs compared as fp32 values with the fp8 tolerance (check.TOLERANCE), not bit-exact
    xq = next(o for o in rep["outputs"] if o["name"] == "xq")
    assert xq["dtype"] == "float8_e4m3fn" and not xq["exact"]


def test_planner_run_check_cli(plan_path, capsys):
    assert main(["run", str(plan_path), "--check", "--num-tokens", "7"]) == 0
    assert "result: OK (14 outputs x 1 rank(s))" in capsys.readouterr().out


def test_dtype_aliases_in_op_arguments_run(tmp_path):
    """float16, e5m2, float8_e4m3fn, float in op arguments name the same dtypes as in tensor
    declarations (they reached the executor as written: KeyError 'e5m2')."""
    p = write(tmp_path, """
plan: aliases
dims:
  num_tokens: 1..8
inputs:
  x: bf16[num_tokens, 128]
weights:
  w: bf16[64, 128]
outputs: [a, q, s, b, c, d]
ops:
  - a: gemm(x, w, out_dtype=float16)
  - q, s: quantize(x, e5m2)
  - b: copy(x, dtype=float8_e4m3fn)
  - c, d: extern(f, x, shapes=[[num_tokens, 4], [2]], dtypes=[float, int])
""", "aliases.yaml")
    plan = load_plan(p)
    by = {o.id: o for o in plan.ops}
    assert (by["a"].out_dtype, by["q"].dtype, by["b"].dtype, by["c"].dtypes) == \
        ("fp16", "fp8_e5m2", "fp8_e4m3", ["fp32", "int32"])
    rep = run_check(lambda: load_plan(p), num_tokens=5)
    assert rep["ok"], rep["outputs"]


def test_rope_positions_made_in_the_plan_stay_inside_the_cache_and_span_it(tmp_path):
    """Positions cast to int32 (or cut, or gathered) before rope: the check's random positions
    follow them back to the input (a copy made them fall outside a 4-row cache: IndexError), and
    span the whole cache, not only rows 0..7."""
    text = """
plan: rope_pos
dims:
  num_tokens: 1..64
groups:
  tp: 1
inputs:
  q: bf16[num_tokens, 2, 16]
  k: bf16[num_tokens, 1, 16]
  pos64: int64[num_tokens]
weights:
  cs: fp32[ROWS, 16]
outputs: [qr, kr]
ops:
  - pos: all_gather(copy(pos64, dtype=int32)[:num_tokens], tp)
  - qr, kr: rope(q, k, pos, cs)
"""
    small = write(tmp_path, text.replace("ROWS", "4"), "small.yaml")
    rep = run_check(lambda: load_plan(small), num_tokens=8, seed=1)
    assert rep["ok"], rep["outputs"]
    big = load_plan(write(tmp_path, text.replace("ROWS", "512"), "big.yaml"))
    ins, _ = make_data(big, {"num_tokens": 64}, 0, 0, "cpu")
    assert 8 < int(ins["pos64"].max()) < 512


def _block_quantize_weight(w):
    """128x128 block scales of a bf16 weight [N, K] (the DeepSeek-V3 checkpoint layout)."""
    n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    p = torch.zeros(nb * 128, kb * 128)
    p[:n, :k] = w.float()
    blocks = p.view(nb, 128, kb, 128)
    s = blocks.abs().amax((1, 3)).clamp_min(1e-10) / 448.0
    q = (blocks / s[:, None, :, None]).to(torch.float8_e4m3fn).view(nb * 128, kb * 128)[:n, :k]
    return q.contiguous(), s


@pytest.mark.parametrize("m, n, k", [(1, 384, 256), (13, 200, 384), (16, 2112, 512)])
def test_block_scaled_gemm_matches_fp32_within_fp8_error(m, n, k):
    g = torch.Generator().manual_seed(m * n)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) / k ** 0.5).bfloat16()  # N = 200: a partial last block
    xq, sx = quantize_reference(x, torch.float8_e4m3fn, 128)
    wq, sw = _block_quantize_weight(w)
    y = gemm_fp8_reference(xq, wq, sx, sw, "block", "block", torch.float32)
    ref = x.float() @ w.float().t()
    # two e4m3 roundings (3 mantissa bits each) over K products: the error norm stays under 6%
    assert float((y - ref).norm() / ref.norm()) < 0.06
    # and the dequantized operands reproduce the output exactly (same math, fp32)
    exact = dequantize(xq, sx, "block") @ dequantize(wq, sw, "block").t()
    assert torch.allclose(y, exact, rtol=1e-5, atol=1e-5)


def test_tensor_and_row_col_scales_dequantize_as_declared():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(5, 64, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(8, 64, generator=g).to(torch.float8_e4m3fn)
    s_row, s_col, s1 = torch.rand(5, 1, generator=g) + 0.5, torch.rand(8, 1, generator=g) + 0.5, torch.tensor([0.25])
    y = gemm_fp8_reference(q, w, s_row, s_col, "row", "col", torch.float32)
    assert torch.allclose(y, (q.float() * s_row) @ (w.float() * s_col).t(), rtol=1e-6)
    y = gemm_fp8_reference(q, w, s1, s1, "tensor", "tensor", torch.float32)
    assert torch.allclose(y, 0.0625 * (q.float() @ w.float().t()), rtol=1e-6)


@pytest.mark.parametrize("dtype, fmax", [(torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)])
def test_quantize_groups_and_scales(dtype, fmax):
    x = torch.randn(7, 512, generator=torch.Generator().manual_seed(2)).bfloat16()
    q, s = quantize_reference(x, dtype, 128)
    assert q.dtype == dtype and s.shape == (7, 4) and s.dtype == torch.float32
    groups = x.float().view(7, 4, 128)
    assert torch.allclose(s, groups.abs().amax(-1) / fmax)
    deq = (q.float().view(7, 4, 128) * s.unsqueeze(-1)).view(7, 512)
    # e4m3 keeps 3 mantissa bits (relative step 2^-3, rounding error <= 2^-4); e5m2 keeps 2
    rel = 2.0 ** -4 if dtype == torch.float8_e4m3fn else 2.0 ** -3
    big = x.float().abs() > s.repeat_interleave(128, 1) * 2 ** -6 * fmax / 448  # normal range
    assert bool(((deq - x.float()).abs() <= rel * x.float().abs() + 1e-6)[big].all())


def test_norms_and_activations_against_formulas():
    g = torch.Generator().manual_seed(4)
    x, r = torch.randn(6, 64, generator=g), torch.randn(6, 64, generator=g)
    w = torch.rand(64, generator=g) + 0.5
    want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    assert torch.allclose(rmsnorm_ref(x, w, 1e-6), want, atol=1e-6)
    normed, new_res = add_rmsnorm_ref(x.bfloat16(), r.bfloat16(), w.bfloat16(), 1e-6)
    s = x.bfloat16().float() + r.bfloat16().float()
    assert torch.equal(new_res, s.bfloat16())
    assert torch.allclose(normed.float(), rmsnorm_ref(s, w.bfloat16(), 1e-6), atol=2e-2, rtol=1e-2)
    xb, rb = x.bfloat16().clone(), r.bfloat16().clone()
    outs = add_rmsnorm_ref(xb, rb, w.bfloat16(), 1e-6, inplace=True)
    assert outs[0].data_ptr() == xb.data_ptr() and outs[1].data_ptr() == rb.data_ptr()
    assert torch.equal(outs[0], normed) and torch.equal(outs[1], new_res)
    gate, up = x[:, :32], x[:, 32:]
    assert torch.allclose(gated_ref(x, "silu"), gate / (1 + torch.exp(-gate)) * up, atol=1e-6)
    erf_gelu = 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2)))
    assert torch.allclose(gated_ref(x, "gelu"), erf_gelu * up, atol=1e-6)


@pytest.mark.parametrize("interleave", [False, True])
def test_rope_is_a_rotation_by_position(interleave):
    g = torch.Generator().manual_seed(5)
    t, h, d, maxp = 5, 3, 16, 32
    q, k = torch.randn(t, h, d, generator=g), torch.randn(t, d, generator=g)
    pos = torch.tensor([0, 3, 7, 31, 3])
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    ang = torch.arange(maxp).float()[:, None] * inv[None]
    cache = torch.cat([ang.cos(), ang.sin()], -1)
    qo, ko = rope_ref(q, k, pos, cache, interleave)

    def rotate(x):  # as complex numbers: pairs (even, odd) or (first half, second half)
        pairs = torch.stack((x[..., 0::2], x[..., 1::2]), -1) if interleave else torch.stack(
            (x[..., : d // 2], x[..., d // 2:]), -1)
        z = torch.view_as_complex(pairs.contiguous())
        a = ang[pos] if x.dim() == 2 else ang[pos][:, None]
        zr = torch.view_as_real(z * torch.polar(torch.ones_like(a), a))
        return zr.flatten(-2) if interleave else torch.cat((zr[..., 0], zr[..., 1]), -1)
    assert torch.allclose(qo, rotate(q), atol=1e-5) and torch.allclose(ko, rotate(k), atol=1e-5)
    assert torch.allclose(qo[0], q[0])  # position 0: identity


def test_flashinfer_and_cute_capability_reasons_on_cpu(plan_path):
    plan = load_plan(plan_path)
    cp = compile_plan(plan)
    g = cp.graph
    norm = next(g.nodes[v]["op"] for v in g.nodes if g.nodes[v]["op"].op == "rmsnorm")
    specs = [cp.tensors[n] for n in norm.inputs()]
    assert lookup(norm, specs, "cpu", ("flashinfer", "torch")).backend == "torch"
    with pytest.raises(UnsupportedOp, match="flashinfer: needs a CUDA device"):
        lookup(norm.model_copy(update={"backend": "flashinfer"}), specs, "cpu")
    gemm = g.nodes["y"]["op"]
    gspecs = [cp.tensors[n] for n in gemm.inputs()]
    with pytest.raises(UnsupportedOp) as ei:
        lookup(gemm.model_copy(update={"backend": "cute"}), gspecs, "cpu")
    assert "cute: needs a CUDA device" in str(ei.value)
    from executors.backends.gemm import _cute_supports, _fi_fp8_pick
    why = _cute_supports(gemm, gspecs, "cuda")  # no GPU here: the module or the GPU is missing
    assert isinstance(why, str) and why
    assert "fp8_blockscale_sm90" in _fi_fp8_pick(gemm, gspecs, "cpu")[1]
    assert lookup(gemm, gspecs, "cpu").backend == "torch"


def test_multi_result_extern_binding_errors(plan_path):
    plan = load_plan(plan_path)
    cp = compile_plan(plan)
    ins, w = make_data(plan, {"num_tokens": 3}, 0, 0, "cpu")
    ext = default_externs(plan)
    outs = build_executor(cp, w, externs=ext, device="cpu")(dims={"num_tokens": 3}, **ins)
    assert outs["a"].shape == (3, 256) and outs["b"].dtype == torch.int32 and bool((outs["b"] >= 0).all())
    bad = {"routed": lambda h: (h,)}
    ex = build_executor(compile_plan(load_plan(plan_path)), w, externs=bad, device="cpu")
    with pytest.raises(RuntimeError, match="returned 1 results; the plan declares 2 results"):
        ex(dims={"num_tokens": 3}, **ins)
    bad = {"routed": lambda h: (h, h)}
    ex = build_executor(compile_plan(load_plan(plan_path)), w, externs=bad, device="cpu")
    with pytest.raises(RuntimeError, match="as result 1; the plan declares"):
        ex(dims={"num_tokens": 3}, **ins)


def test_tune_dry_run_records_keyed_ops_and_applies_them(plan_path):
    from executors.tools.tune import tune_plan
    res = tune_plan(str(plan_path), device="cpu", iters=1, trials=1, nsets=1, buckets=[4, 16], log=lambda m: None)
    keyed = {s: e["backend"] for s, e in res["backends"].items() if not s.startswith("gemm:bf16")}
    assert "rmsnorm:bf16:M=16,N=256" in keyed and "gemm:fp8_e4m3:M=4,N=384,K=256,sa=block,sb=block,out=bf16" in keyed
    assert "rope:bf16:M=16,q=8x32,k=1x32,il=1" in keyed and "quantize:bf16:M=4,N=256,to=fp8_e4m3,g=128" in keyed
    assert set(keyed.values()) == {"torch"} and all(res["candidates"][s]["torch"] > 0 for s in keyed)
    plan = load_plan(plan_path)
    ins, w = make_data(plan, {"num_tokens": 5}, 0, 0, "cpu")
    ex = build_executor(compile_plan(plan), w, externs=default_externs(plan), tuning=res, device="cpu")
    for op_id in ("h", "xq", "y", "act", "qr"):
        assert ex.backends[op_id] == "tuned:torch", ex.backends
    assert set(ex(dims={"num_tokens": 5}, **ins)) == set(plan.outputs)


def test_tuned_backend_replaces_torch_up_to_the_tuned_m(plan_path, monkeypatch):
    """A tuning entry naming another registered backend rewires the step for M <= its bucket."""
    from executors.backends import registry
    from executors.backends.torch_pointwise import rmsnorm_ref

    def make(op, bctx):  # a stand-in "kernel": torch's result, tagged by a sign flip
        return lambda ins, b, out: -rmsnorm_ref(ins[0], ins[1], op.eps)
    monkeypatch.setitem(registry._REGISTRY, ("rmsnorm", "other"), registry.Impl("rmsnorm", "other", make,
                                                                                  lambda op, s, d: None))
    plan = load_plan(plan_path)
    tuning = {"limits": {}, "backends": {"rmsnorm:bf16:M=4,N=256": {"backend": "other", "config": None}},
              "measured": {}, "variants": {}}
    ex = build_executor(compile_plan(plan), make_data(plan, {"num_tokens": 4}, 0, 0, "cpu")[1],
                        externs=default_externs(plan), tuning=tuning, device="cpu")
    ref = build_executor(compile_plan(load_plan(plan_path)), make_data(plan, {"num_tokens": 4}, 0, 0, "cpu")[1],
                         externs=default_externs(plan), device="cpu")
    norm = next(v for v in ex.backends if v.startswith("gu.a"))
    assert ex.backends[norm] == "tuned:other"
    for m, flipped in ((3, True), (4, True), (9, False)):
        ins = make_data(plan, {"num_tokens": m}, 1, 0, "cpu")[0]
        got = ex(dims={"num_tokens": m}, **ins)["act"]
        want = ref(dims={"num_tokens": m}, **ins)["act"]
        assert torch.equal(got, want) != flipped, m


def test_cute_fp8_registration_against_its_api(plan_path, monkeypatch):
    """executors/cute/fp8.py (supports_fp8 / gemm_fp8) stood in by a module with that API: the
    capability check passes its answer through, the runner takes the kernel where it says yes
    and the torch implementation elsewhere (an explicit backend=cute gets an error instead)."""
    import importlib.machinery
    import sys
    import types

    from executors import cute
    from executors.backends.gemm import _cute_gemm, _cute_supports
    calls = []
    fake = types.ModuleType("executors.cute.fp8")
    fake.__spec__ = importlib.machinery.ModuleSpec("executors.cute.fp8", None)

    def supports_fp8(m_max, n, k, ka, kb, device):
        return None if m_max <= 8 and (ka, kb) == ("block", "block") else f"M={m_max} or {ka}x{kb}"

    def gemm_fp8(x, w, sa, sb, out=None, out_dtype=torch.bfloat16):
        calls.append(x.shape[0])
        return gemm_fp8_reference(x, w, sa, sb, "block", "block", out_dtype, out)
    fake.supports_fp8, fake.gemm_fp8 = supports_fp8, gemm_fp8
    monkeypatch.setitem(sys.modules, "executors.cute.fp8", fake)
    monkeypatch.setattr(cute, "fp8", fake, raising=False)
    monkeypatch.setattr(cute, "available", lambda: True)
    plan = load_plan(plan_path)
    cp = compile_plan(plan)
    op = cp.graph.nodes["y"]["op"]
    specs = [cp.tensors[n] for n in op.inputs()]
    assert _cute_supports(op, specs, "cuda") is None
    tensor_op = cp.graph.nodes["yt"]["op"]
    assert _cute_supports(tensor_op, [cp.tensors[n] for n in tensor_op.inputs()], "cuda") == "M=1 or rowxtensor"
    from types import SimpleNamespace
    run = _cute_gemm(op, SimpleNamespace(specs=cp.tensors, params=plan.params))
    for m in (4, 12):
        ins, w = make_data(plan, {"num_tokens": m}, 2, 0, "cpu")
        xq, sx = quantize_reference(torch.randn(m, 256).bfloat16(), torch.float8_e4m3fn, 128)
        got = run([xq, w["wq"], sx, w["sq"]], {}, None)
        assert torch.equal(got, gemm_fp8_reference(xq, w["wq"], sx, w["sq"], "block", "block", torch.bfloat16))
    assert calls == [4]  # M = 12 is past what the kernel said it takes: torch ran it
    explicit = _cute_gemm(op.model_copy(update={"backend": "cute"}), SimpleNamespace(specs=cp.tensors, params={}))
    with pytest.raises(RuntimeError, match="backend cute cannot run this fp8 gemm"):
        explicit([xq, w["wq"], sx, w["sq"]], {}, None)


def test_tuned_backends_that_cannot_run_here_leave_those_sizes_to_the_registry(plan_path):
    """A tuning measured on a GPU (flashinfer norms, CuTe gemms) applied where those libraries
    or that GPU are absent: the build succeeds, those sizes run the registry's choice, the
    backend label says so, and the results are the reference's."""
    from planner.lang.loader import load_plan as _load
    plan = _load(plan_path)
    w = make_data(plan, {"num_tokens": 4}, 0, 0, "cpu")[1]
    cp = compile_plan(_load(plan_path))
    n, k = 512, 256  # the bf16 gemm gu (wg)
    tuning = {"limits": {}, "measured": {}, "variants": {}, "backends": {
        "rmsnorm:bf16:M=4,N=256": {"backend": "flashinfer", "config": None},
        f"gemm:bf16:M=2,N={n},K={k}": {"backend": "flashinfer:cutlass", "config": None},
        f"gemm:bf16:M=4,N={n},K={k}": {"backend": "cute", "config": None},
        f"gemm:bf16:M=8,N={n},K={k}": {"backend": "torch", "config": None}}}
    ex = build_executor(cp, w, externs=default_externs(plan), tuning=tuning, device="cpu")
    ref = build_executor(compile_plan(_load(plan_path)), w, externs=default_externs(plan), device="cpu")
    labels = set(ex.backends.values())
    assert any("(cute, flashinfer:cutlass cannot run here" in str(b) for b in labels), labels
    for m in (1, 3, 4, 7):
        ins = make_data(plan, {"num_tokens": m}, 2, 0, "cpu")[0]
        got, want = ex(dims={"num_tokens": m}, **ins), ref(dims={"num_tokens": m}, **ins)
        assert all(torch.equal(got[o], want[o]) for o in want), m
