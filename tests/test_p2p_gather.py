"""The "p2p" all_gather backend (executors/p2p.py): capability checks on CPU, bit-exact gathers
on two GPUs (eager = NCCL, captured = copy-engine pushes into symmetric memory)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from executors.backends import lookup
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan

SP = Path(__file__).resolve().parent.parent / "plans" / "k3_sp_tail.yaml"
two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs 2 CUDA GPUs")


def _gather(cp):
    g = cp.graph
    v = next(v for v in cp.schedule if g.nodes[v]["op"].op == "all_gather")
    op = g.nodes[v]["op"]
    return op, [cp.tensors[n] for n in op.inputs()]


def test_lookup_prefers_p2p_on_cuda_and_torch_elsewhere(monkeypatch):
    op, specs = _gather(compile_plan(load_plan(SP, {"tp_size": 2})))
    assert lookup(op, specs, "cuda").backend == "p2p"
    assert lookup(op, specs, "cpu").backend == "torch"
    monkeypatch.setenv("PLANNER_P2P", "0")
    assert lookup(op, specs, "cuda").backend == "torch"


def test_p2p_refuses_other_dims_and_dynamic_rows():
    from executors.backends.p2p import p2p_supports
    op, specs = _gather(compile_plan(load_plan(SP, {"tp_size": 2})))
    assert p2p_supports(op, specs, "cuda") is None
    assert "dim 0" in p2p_supports(op.model_copy(update={"dim": 1}), specs, "cuda")
    dyn = dataclasses.replace(specs[0], shape=(specs[0].shape[0], "num_tokens"))
    assert "static" in p2p_supports(op, [dyn], "cuda")
    assert "CUDA" in p2p_supports(op, specs, "cpu")


def test_buffer_is_sized_for_the_largest_dims():
    from executors.backends.p2p import _max_shape
    from executors.lowering import _BuildCtx
    cp = compile_plan(load_plan(SP, {"tp_size": 2}))
    op, specs = _gather(cp)
    hi = cp.plan.dims["num_tokens"].hi
    shape = _max_shape(specs[0], _BuildCtx(cp, torch.device("cpu"), {}, {}))
    assert shape[0] == -(-hi // 2) and shape[1] == specs[0].shape[1]


# ---------------------------------------------------------------------------------- 2 GPUs

def _ranks_body(rank, world, tokens, sm_bytes):
    import executors.backends.p2p as p2p
    from executors import build_executor
    p2p.MIN_BYTES, p2p.SM_BYTES = 0, sm_bytes
    from executors.cudagraph import GraphedExecutor
    dev = torch.device("cuda", rank)
    names = ["final", "aux2", "aux46", "aux90"]
    cp = compile_plan(load_plan(SP, {"tp_size": world}))
    ex = build_executor(cp, {}, device=dev)
    gather_backends = {b for s, b in ex.backends.items() if cp.graph.nodes[s]["op"].op == "all_gather"}
    gex = GraphedExecutor(ex, buckets=sorted(set(tokens)))
    bad = []
    for T in tokens:
        loc = -(-T // world)
        for trial in range(2):
            g = torch.Generator(device="cpu").manual_seed(100 * T + 10 * rank + trial)
            ins = {n: torch.randn(loc, 7168, generator=g).bfloat16().to(dev) for n in names}
            parts = {n: [torch.empty_like(ins[n]) for _ in range(world)] for n in names}
            for n in names:
                torch.distributed.all_gather(parts[n], ins[n])
            want = {n: torch.cat(parts[n])[:T] for n in names}
            eager = ex(dims={"num_tokens": T}, **ins)
            graphed = gex(dims={"num_tokens": T}, **ins)
            torch.cuda.synchronize()
            for n in names:
                if not torch.equal(eager[f"{n}_full"], want[n]):
                    bad.append(("eager", T, n))
                if not torch.equal(graphed[f"{n}_full"], want[n]):
                    bad.append(("graph", T, n))
    return {"backends": sorted(gather_backends), "bad": bad}


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("sm_bytes", [0, 1 << 40])  # copy engines only / SM copies only; ragged T too
def test_p2p_gather_bit_exact_eager_and_graphed(sm_bytes):
    from executors.tools.ranks import run_ranks
    res = run_ranks(_ranks_body, 2, [8, 33, 1024, 4096], sm_bytes, backend="nccl", timeout_s=300,
                    coll_timeout_s=120)
    for r in res:
        assert r["backends"] == ["p2p"], r
        assert r["bad"] == [], r


@pytest.mark.parametrize("n", [1, 3, 4, 1000, 4099])
@pytest.mark.parametrize("sm", [False, True])
def test_copy_is_bit_exact_both_ways(n, sm):
    from executors.backends.p2p import _copy
    a = torch.randn(n).bfloat16()
    special = torch.tensor([-0.0, float("nan"), float("inf"), -float("inf"), 1e-40]).bfloat16()
    a[: min(n, 5)] = special[: min(n, 5)]
    b = torch.full_like(a, 7.0)
    _copy(b.view(torch.uint8), a.view(torch.uint8), sm)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
