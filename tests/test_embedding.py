"""Embedding a built executor in a model: the custom op under torch.compile, the out= form,
the input check at the call (eager, through the op, and at trace time)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

from executors import build_executor
from executors.errors import InputError
from executors.tools.check import compile_for_run
from planner.lang.loader import load_plan
from tests.speed import best_of, in_units

ROOT = Path(__file__).resolve().parent.parent
KDA = ROOT / "plans" / "k3_kda_projection.yaml"
SMALL = {"hidden": 256, "kda_heads": 64, "head_dim": 16, "fa_rank": 32}  # 8 local heads at tp 8


def _example(name):
    ex = str(ROOT / "examples")
    if ex not in sys.path:
        sys.path.insert(0, ex)
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def kda():
    plan = load_plan(KDA, SMALL)
    g = torch.Generator().manual_seed(0)
    ws = {n: torch.randn(plan.tensors[n].shape, generator=g).bfloat16() for n in plan.weights}
    return build_executor(compile_for_run(plan), ws, device="cpu")


def _x(m, hidden=256, seed=1):
    return torch.randn(m, hidden, generator=torch.Generator().manual_seed(seed)).bfloat16()


def test_k3_block_compiles_fullgraph_dynamic_on_two_gloo_ranks():
    """Two KDA layers + the SP tail (2 gloo ranks): compiled == eager (bitwise) at T = 1..16, one
    Dynamo graph (no recompile after the first dynamic compile), zero graph breaks."""
    res = _example("k3_compiled_model").main(world=2, t_max=16, hidden=32)
    for r in res:
        assert len(r["equal"]) == 17 and all(r["equal"]), r
        assert r["graphs"] == 1 and r["breaks"] == 0, r
        assert r["layout_copies"] == 0, r  # the fallback variant ran: outputs are views, no copies


def test_op_schema_fake_kernel_and_views(kda):
    """The functional op returns the packed buffer the outputs are views of (no two returned
    tensors alias); torch.library.opcheck accepts its schema and fake kernel; the traced views
    equal the eager outputs."""
    x = _x(3)
    roots = kda._op(x, None)
    assert [tuple(t.shape) for t in roots] == [(3, 556), (3, 128)]  # proj (qkvg + fab), g1
    torch.library.opcheck(kda._op, (x, None))
    torch.library.opcheck(kda._op, (_x(1), 1))
    eager = kda(x=x)
    views = kda._op_spec.views(list(roots), {"num_tokens": 3})
    for name, t in eager.items():
        assert torch.equal(views[name], t) and views[name].stride() == t.stride(), name
    assert kda._op.name().startswith("planner::k3_kda_projection_") and kda.op_layout_copies == 0


def test_op_names_differ_with_the_plans_params(kda):
    """Inductor's on-disk caches know a custom op by its name: a plan built with other params (in
    another process, where the per-process count starts again) must not take the same name, or
    the cached graph's layout asserts (the old fake kernel's shapes) fail its first call."""
    import re

    def stem(ex):  # the name without its per-process count
        return re.sub(r"_\d+$", "", ex._op.name())

    def build(over):
        plan = load_plan(KDA, {**SMALL, **over})
        ws = {n: torch.zeros(plan.tensors[n].shape).bfloat16() for n in plan.weights}
        return build_executor(compile_for_run(plan), ws, device="cpu")
    same, other = build({}), build({"fab_pad": 8})
    assert stem(same) == stem(kda) and stem(other) != stem(kda)


def test_out_form_writes_into_callers_tensors(kda):
    x = _x(5)
    want = kda(x=x)
    out = {n: torch.full_like(t, float("nan")) for n, t in want.items()}
    ptrs = {n: t.data_ptr() for n, t in out.items()}
    got = kda(x=x, out=out)
    assert got is out and all(torch.equal(out[n], want[n]) and out[n].data_ptr() == ptrs[n] for n in want)
    f = torch.compile(lambda x, o: kda(x=x, out=o), fullgraph=True, dynamic=True)
    out2 = {n: torch.full_like(t, float("nan")) for n, t in want.items()}
    f(x, out2)
    assert all(torch.equal(out2[n], want[n]) for n in want)
    with pytest.raises(InputError, match=r"out\['g1'\] must be bf16\[5, 128\]"):
        kda(x=x, out={**out, "g1": torch.zeros(5, 127, dtype=torch.bfloat16)})
    with pytest.raises(InputError, match="out= must be a dict naming the outputs"):
        kda(x=x, out={"g1": out["g1"]})


BAD = [
    ("wrong dtype", {"x": _x(2).float()}, r"input 'x' must be bf16\[num_tokens, 256\] contiguous on cpu; got fp32\[2, 256\]"),
    ("non-contiguous", {"x": _x(2, 512)[:, ::2]}, r"input 'x' must be .* contiguous on cpu; got bf16\[2, 256\] non-contiguous"),
    ("meta device", {"x": torch.empty(2, 256, dtype=torch.bfloat16, device="meta")}, r"input 'x' .* on cpu; got bf16\[2, 256\] on meta"),
    ("a list", {"x": [[0.0] * 256]}, r"input 'x' must be a tensor bf16\[num_tokens, 256\] .*got list"),
    ("too many tokens", {"x": _x(17)}, r"num_tokens = 17 is outside the plan's range 1..16"),
    ("wrong width", {"x": _x(2, 255)}, r"input 'x' dim 1 is 255 but the plan declares 256"),
    ("wrong rank", {"x": _x(2).view(2, 16, 16)}, r"input 'x' must be bf16\[num_tokens, 256\].*got bf16\[2, 16, 16\]"),
    ("missing", {}, r"takes inputs \['x'\]; missing \['x'\], unexpected \[\]"),
    ("unknown", {"x": _x(2), "y": _x(2)}, r"missing \[\], unexpected \['y'\]"),
]


@pytest.mark.parametrize("case,inputs,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_raise_one_clear_error_and_executor_stays_usable(kda, case, inputs, msg):
    before = kda(x=_x(2))
    with pytest.raises(InputError, match=msg):
        kda(**inputs)
    if set(inputs) == {"x"} and isinstance(inputs["x"], torch.Tensor):
        with pytest.raises(InputError, match=msg):  # the op's body checks the same way
            kda._op(inputs["x"], None)
    after = kda(x=_x(2))
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_bad_input_under_compile_names_the_input(kda):
    """At trace time the fake kernel checks dtype, device, rank and declared contiguity; Dynamo
    reports the InputError text."""
    f = torch.compile(lambda x: kda(x=x)["g1"], fullgraph=True, dynamic=True)
    f(_x(3))
    with pytest.raises(Exception, match=r"input 'x' must be bf16\[num_tokens, 256\] contiguous on cpu; got fp32\[s"):
        f(_x(3).float())
    # names and tensor-ness are checked in the traced code: Dynamo reports the InputError's text
    g = torch.compile(lambda x: kda(y=x), fullgraph=True, dynamic=True)
    with pytest.raises(Exception, match=r"takes inputs \['x'\]; got \['y'\]"):
        g(_x(3))
    h = torch.compile(lambda x: kda(x=[x]), fullgraph=True, dynamic=True)
    with pytest.raises(Exception, match=r"input 'x' must be a tensor bf16\[num_tokens, 256\] contiguous on cpu, got list"):
        h(_x(3))
    with pytest.raises(InputError, match="dims= names \\['tokens'\\]"):
        kda(x=_x(3), dims={"tokens": 3})


def test_check_cost_per_call_is_microseconds(kda):
    x = _x(4)
    kda.check_inputs({"x": x})
    best = best_of(lambda: kda.check_inputs({"x": x}), repeat=5, number=2000)
    # 10 us on a dev machine where a reference workload takes 5 ms: 1/500 of one
    assert in_units(best) < 1 / 500, f"input check took {best * 1e6:.2f} us per call ({in_units(best):.5f} units)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_op_captures_three_ways():
    """torch.cuda.graph, mode='reduce-overhead' and a piecewise split (scripts/bench_embedding.py
    times them): each equals the eager executor at M = 1..16."""
    mod = _example("kda_projection_module")
    block = mod.KDAProjection(device="cuda")
    for m in (1, 5, 16):
        x = torch.randn(m, 7168, device="cuda").bfloat16()
        want = block(x)
        static = x.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                block(static)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            got = block(static)
        g.replay()
        torch.cuda.synchronize()
        for a, b in zip(want, got, strict=True):
            torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
        ro = torch.compile(block, mode="reduce-overhead", fullgraph=True, dynamic=False)
        for _ in range(3):
            got = ro(x)
        torch.cuda.synchronize()
        for a, b in zip(want, got, strict=True):
            torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
