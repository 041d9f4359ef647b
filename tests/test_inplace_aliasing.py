"""In-place ops over values that may be another tensor's memory: a shard (a view of its input
where no padding is needed), a region output (whichever variant ran), and model code that hands
back its argument. Each would overwrite the caller's tensors; each is refused at load or copied
at the call, and the legitimate forms stay allowed."""

from __future__ import annotations

import pytest
import torch

from executors.lowering import build_executor
from planner.pipeline import compile_plan
from tests.planutil import diagnostic, load

H = """
plan: p
params:
  tp_size: 1
dims:
  num_tokens: 1..16
groups:
  tp: tp_size
inputs:
  h: bf16[num_tokens, 64]
  res: bf16[num_tokens, 64]
weights:
  n: bf16[64]
"""
NORM = "  - y, r: add_rmsnorm({a}, {b}, n, inplace=true)\n  - out: add(y, r)\n"


def _body(ops, a, b="rr", extra="  - rr: copy(res)\n"):
    return "outputs: [out]\nops:\n" + ops + extra + NORM.format(a=a, b=b)


def _norm_ref(x, res):
    s = x.float() + res.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16().float() + s.bfloat16().float()


@pytest.mark.parametrize("ops, a, b, extra", [
    ("  - hs: shard(h, tp)\n", "hs", "rr", "  - rr: copy(res)\n"),
    ("  - hs: shard(h, tp)\n  - rs: shard(res, tp)\n", "hs", "rs", ""),
    ("  - hs: all_reduce(h, tp)\n", "hs", "rr", "  - rr: copy(res)\n"),
    ("  - hs: all_gather(h, tp)\n  - rs: extern(ident, res, shape=[num_tokens, 64])\n", "hs", "rs", ""),
])
@pytest.mark.parametrize("fuse", [True, False])
def test_in_place_over_what_hands_back_its_input_at_some_sizes_leaves_the_input_alone(tmp_path, ops, a, b, extra,
                                                                                       fuse):
    """A shard without padding, a collective over one rank and model code hand back their input:
    the executor copies it before the in-place write (caller's tensors unchanged, results right)."""
    from planner.config import CompileConfig
    plan = load(tmp_path, _body(ops, a, b, extra), H)
    cfg = CompileConfig(disable_passes=set() if fuse else {"fuse-allreduce-norm"})
    ex = build_executor(compile_plan(plan, cfg), {"n": torch.ones(64, dtype=torch.bfloat16)}, device="cpu",
                        externs={"ident": lambda t: t})
    h, res = torch.randn(6, 64).bfloat16(), torch.randn(6, 64).bfloat16()
    h0, res0 = h.clone(), res.clone()
    out = ex(h=h, res=res)["out"]
    assert torch.equal(h, h0) and torch.equal(res, res0)
    assert torch.allclose(out.float(), _norm_ref(h0, res0).bfloat16().float(), atol=0.07)


def test_in_place_over_a_shard_of_a_plan_made_value_runs(tmp_path):
    plan = load(tmp_path, _body("  - c: copy(h)\n  - hs: shard(c, tp)\n", "hs"), H)
    ex = build_executor(compile_plan(plan), {"n": torch.ones(64, dtype=torch.bfloat16)}, device="cpu")
    h, res = torch.randn(6, 64).bfloat16(), torch.randn(6, 64).bfloat16()
    h0 = h.clone()
    out = ex(h=h, res=res)["out"]
    s = h0.float() + res.float()
    ref = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16().float() + s.bfloat16().float()
    assert torch.equal(h, h0) and torch.allclose(out.float(), ref.bfloat16().float(), atol=0.07)


REGION = """  - region: pick
    outputs: [t]
    variants:
      - name: small
        when: num_tokens <= 8
        ops:
          - t: {small}
      - name: big
        ops:
          - t: copy(h)
"""


@pytest.mark.parametrize("small, want", [
    ("view(h, [num_tokens, 64])", "may be a view (variant 'small' of region 'pick' makes it as"),
    ("h[:, :64]", "inplace: 't' is not contiguous"),
])
def test_in_place_over_a_region_output_that_a_variant_makes_as_a_view(tmp_path, small, want):
    d = diagnostic(tmp_path, _body(REGION.format(small=small), "t"), H)
    assert want in d.message, d.message


def test_a_strided_in_place_operand_is_named_as_such(tmp_path):
    head = H.replace("h: bf16[num_tokens, 64]", "h: bf16[num_tokens, 128]")
    d = diagnostic(tmp_path, _body(REGION.format(small="h[:, :64]").replace("copy(h)", "copy(h[:, :64])"), "t"), head)
    assert "inplace: 't' is not contiguous" in d.message and "None" not in d.message, d.message


def test_in_place_over_a_region_output_every_variant_makes_fresh_runs(tmp_path):
    plan = load(tmp_path, _body(REGION.format(small="add(h, h)"), "t"), H)
    assert plan.tensors["t"].producer is not None


@pytest.mark.parametrize("fn", [lambda t: t, lambda t: t.view(t.shape), lambda t: t[:, :]])
def test_model_code_that_hands_back_its_argument_is_copied_before_an_in_place_write(tmp_path, fn):
    body = "outputs: [out]\nops:\n  - e: extern(ident, h, shape=[num_tokens, 64])\n  - rr: copy(res)\n" \
           + NORM.format(a="e", b="rr")
    ex = build_executor(compile_plan(load(tmp_path, body, H)), {"n": torch.ones(64, dtype=torch.bfloat16)},
                        device="cpu", externs={"ident": fn})
    h, res = torch.randn(4, 64).bfloat16(), torch.randn(4, 64).bfloat16()
    h0 = h.clone()
    ex(h=h, res=res)
    assert torch.equal(h, h0)


def test_several_results_of_model_code_in_one_buffer_are_separate_values(tmp_path):
    body = ("outputs: [out]\nops:\n  - a, b: extern(two, h, shapes=[[num_tokens, 64], [num_tokens, 64]])\n"
            + NORM.format(a="a", b="b"))
    buf = {}

    def two(t):
        buf["x"] = t * 2
        return buf["x"], buf["x"]
    ex = build_executor(compile_plan(load(tmp_path, body, H)), {"n": torch.ones(64, dtype=torch.bfloat16)},
                        device="cpu", externs={"two": two})
    h = torch.randn(4, 64).bfloat16()
    out = ex(h=h, res=h)["out"]
    s = (h.float() * 2) * 2
    ref = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16().float() + s.bfloat16().float()
    assert torch.allclose(out.float(), ref.bfloat16().float(), atol=0.25), (out.float() - ref).abs().max()


def test_model_code_run_for_its_effects_is_kept_and_unread_model_code_is_a_warning(tmp_path, capsys):
    from planner.cli import main
    from tests.planutil import compiled, write
    body = ("outputs: [out]\nops:\n  - _: extern(kv_write, h, res, shape=[1]{flag})\n  - out: add(h, res)\n")
    cp = compiled(tmp_path / "a", body.format(flag=", effects=true"), H)
    kept = [v for v in cp.graph.nodes if cp.graph.nodes[v]["op"].op == "extern"]
    assert len(kept) == 1 and cp.graph.nodes[kept[0]]["stream"] == "main"
    calls = []
    ex = build_executor(cp, {"n": torch.ones(64, dtype=torch.bfloat16)}, device="cpu",
                        externs={"kv_write": lambda h, r: calls.append(h.shape) or torch.zeros(1).bfloat16()})
    ex(h=torch.randn(3, 64).bfloat16(), res=torch.randn(3, 64).bfloat16())
    assert calls == [torch.Size([3, 64])]
    p = write(tmp_path / "b", H.lstrip("\n") + body.format(flag=""))
    assert main(["validate", str(p)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {p}:15:8: extern" in err and "(kv_write) is removed: nothing reads its results (write effects=true" in err
    d = diagnostic(tmp_path / "c", body.format(flag=", effects=true, stream=aux"), H)
    assert "effects=true keeps this code on the caller's stream (main)" in d.message


def test_a_plan_that_only_writes_state_needs_no_outputs(tmp_path):
    body = "ops:\n  - _: extern(kv_write, h, res, shape=[1], effects=true)\n"
    plan = load(tmp_path, body, H)
    seen = []

    def kv_write(h, cache):
        cache[: h.shape[0]].copy_(h)
        seen.append(h.shape[0])
        return torch.zeros(1).bfloat16()
    ex = build_executor(compile_plan(plan), {"n": torch.ones(64, dtype=torch.bfloat16)}, device="cpu",
                        externs={"kv_write": kv_write})
    h, cache = torch.randn(3, 64).bfloat16(), torch.zeros(3, 64).bfloat16()
    assert ex(h=h, res=cache) == {} and seen == [3] and torch.equal(cache, h)
    d = diagnostic(tmp_path / "b", body.replace(", effects=true", ""), H)
    assert "a plan needs at least one output (or model code run for its effects" in d.message


def test_collectives_whose_results_are_written_in_place_are_not_packed(tmp_path):
    """Packed, each result would be a view of the packed buffer, which an in-place norm may not
    write (it was an internal verify error)."""
    from planner.config import CompileConfig
    head = H.replace("tp_size: 1", "tp_size: 2").replace("  n: bf16[64]\n", "  n: bf16[64]\n  w: bf16[64, 64]\n")
    body = ("outputs: [out]\nops:\n  - a: gemm(h, w)\n  - b: gemm(res, w)\n  - ra: all_reduce(a, tp)\n"
            "  - rb: all_reduce(b, tp)\n  - y, r: add_rmsnorm(ra, rb, n, inplace=true)\n  - z: add(a, b)\n"
            "  - out: add(y, z)\n")
    cp = compile_plan(load(tmp_path, body, head), CompileConfig(disable_passes={"fuse-allreduce-norm"},
                                                                verify_each=True))
    rep = cp.report["fuse-collectives"]
    assert not rep["buckets"]
    assert {"ops": ["ra"], "reason": "not packed with any collective: its result 'ra' is overwritten in place"
                                     " by 'y'"} in rep["not_fused"]


EXCL = """
outputs: [y, r]
ops:
  - a: add(h, h)
  - rc: copy(res)
{extra}  - region: norm
    outputs: [y, r]
    variants:
      - name: fast
        when: num_tokens <= 4
        ops:
          - y, r: add_rmsnorm(a, rc, n, inplace=true)
      - name: slow
        ops:
          - {slow}
"""


def test_in_place_in_one_variant_beside_readers_in_the_others(tmp_path):
    """Only one variant of a region runs per call: a reader in another variant never sees the
    write. A reader outside the region, or in the same variant, still does."""
    ok = EXCL.format(extra="", slow="y, r: add_rmsnorm(a, rc, n, inplace=true)")
    plan = load(tmp_path / "a", ok, H)
    ex = build_executor(compile_plan(plan), {"n": torch.ones(64, dtype=torch.bfloat16)}, device="cpu")
    for t in (3, 9):
        h, res = torch.randn(t, 64).bfloat16(), torch.randn(t, 64).bfloat16()
        out = ex(h=h, res=res)
        s = (h + h).float() + res.float()
        want = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
        assert torch.allclose(out["y"].float(), want.float(), atol=0.05), t
    load(tmp_path / "b", EXCL.format(extra="", slow="y, r: add_rmsnorm(add(a, a), rc, n)"), H)
    d = diagnostic(tmp_path / "c", EXCL.format(extra="  - z: add(a, a)\n",
                                               slow="y, r: add_rmsnorm(a, rc, n)").replace("[y, r]\nops", "[y, r, z]\nops", 1), H)
    assert "inplace overwrites 'a', which 'z' also reads" in d.message, d.message
