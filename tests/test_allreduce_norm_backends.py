"""all_reduce_add_rmsnorm backends: capability reasons, lookup on CPU, the torch backend's
semantics (x untouched, inplace residual), and (GPU, 2+ devices) the FlashInfer fused kernel."""

from __future__ import annotations

import pytest
import torch

from executors.backends import UnsupportedOp, backends_for, lookup
from executors.backends.allreduce_norm import (
    WORKSPACE_COMM_BYTES,
    _threads_per_block,
    ar_add_rmsnorm_ref,
    fused_kernel_reason,
    workspace_tokens,
)
from executors.backends.torch_pointwise import add_rmsnorm_ref
from executors.collectives import Comm
from planner.ops import AllReduceAddRmsNorm
from planner.shapes import TensorSpec


def _op(**kw):
    return AllReduceAddRmsNorm(op="all_reduce_add_rmsnorm", id="m", x="o", residual="r", w="n", group="tp",
                               out=["m", "r2"], **kw)


def _specs(dtype="bf16", hidden=7168):
    return [TensorSpec("o", ("num_tokens", hidden), dtype), TensorSpec("r", ("num_tokens", hidden), dtype),
            TensorSpec("n", (hidden,), dtype)]


def test_registered_backends_and_cpu_lookup():
    assert set(backends_for("all_reduce_add_rmsnorm")) >= {"torch", "flashinfer"}
    assert lookup(_op(), _specs(), "cpu", ("flashinfer", "torch")).backend == "torch"
    with pytest.raises(UnsupportedOp, match="flashinfer: needs a CUDA device"):
        lookup(_op(backend="flashinfer"), _specs(), "cpu")
    with pytest.raises(UnsupportedOp, match="needs bf16 or fp16, got fp32"):
        lookup(_op(backend="flashinfer"), _specs("fp32"), "cuda")


def test_fused_kernel_capability_reasons():
    assert _threads_per_block(7168, 2) == 224  # 896 threads per token: 4 blocks of 224 per cluster
    assert _threads_per_block(7164, 2) is None and _threads_per_block(1 << 17, 2) is None
    assert fused_kernel_reason("fp32", 7168, 8, "cuda") == "needs bf16 or fp16, got fp32"
    assert "static hidden size" in fused_kernel_reason("bf16", "hidden", 8, "cuda")
    assert "not a multiple of 8" in fused_kernel_reason("bf16", 7164, 8, "cuda")
    assert "group size 3" in fused_kernel_reason("bf16", 7168, 3, "cuda")
    assert fused_kernel_reason("bf16", 7168, 8, "cpu") == "needs a CUDA device"
    assert workspace_tokens(7168, 8, 2, 256) == 256
    assert workspace_tokens(7168, 8, 2, 8192) == WORKSPACE_COMM_BYTES // (7168 * 2 * 8)


def test_torch_backend_is_the_collective_then_the_norm():
    g = torch.Generator().manual_seed(0)
    x, r, w = (torch.randn(5, 64, generator=g).bfloat16() for _ in range(3))
    w = w[0]
    x0, r0 = x.clone(), r.clone()
    comm = Comm("tp", None, 1, 0)  # size 1: the all_reduce is the identity
    normed, r2 = ar_add_rmsnorm_ref(comm, x, r, w, 1e-6, inplace=False)
    want = add_rmsnorm_ref(x0, r0, w, 1e-6)
    assert torch.equal(normed, want[0]) and torch.equal(r2, want[1])
    assert torch.equal(x, x0) and torch.equal(r, r0)
    normed, r3 = ar_add_rmsnorm_ref(comm, x, r, w, 1e-6, inplace=True)
    assert r3 is r and torch.equal(r, want[1]) and torch.equal(normed, want[0]) and torch.equal(x, x0)


def _fused_rank(rank, world, tokens):
    """The compiled plan with a tuning entry that takes the fused kernel, against fp32."""
    import torch.distributed as dist

    from executors.lowering import build_executor
    from executors.tools.check import compile_for_run
    from planner.lang.loader import load_plan
    from planner.tuning import fusion_key
    from tests.dist_allreduce_norm import PLAN
    text = PLAN.replace("world: 2", f"world: {world}").replace("hidden: 32", "hidden: 1024")
    cp = compile_for_run(load_plan("arn.yaml", text=text))
    g = torch.Generator().manual_seed(11 + rank)
    x, r = (torch.randn(tokens, 1024, generator=g).bfloat16().cuda() for _ in range(2))
    w = (1 + 0.1 * torch.randn(1024, generator=torch.Generator().manual_seed(3))).bfloat16().cuda()
    tuning = {"limits": {}, "fusion": {fusion_key("bf16", 1024, world): {"max_tokens": tokens}}}
    ex = build_executor(cp, {"w": w}, device="cuda", tuning=tuning)
    out = ex(dims={"num_tokens": tokens}, x=x, r=r)
    parts = [torch.empty(tokens, 1024, device="cuda") for _ in range(world)]
    dist.all_gather(parts, x.float())
    s = torch.stack(parts).sum(0) + r.float()
    want = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    return {"backend": ex.backends["normed"], "normed": float((out["normed"].float() - want).abs().max()),
            "r_out": float((out["r_out"].float() - s).abs().max())}


@pytest.mark.gpu
def test_flashinfer_fused_kernel_on_two_gpus():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    from executors.tools.ranks import run_ranks
    for rep in run_ranks(_fused_rank, 2, 16, backend="nccl", timeout_s=300):
        assert rep["backend"] == "flashinfer", rep
        assert rep["normed"] < 0.05 and rep["r_out"] < 0.05, rep


def test_tuning_fusion_entry_is_validated_at_build_and_ignored_on_cpu(tmp_path):
    from executors import build_executor
    from executors.errors import BuildError
    from planner.lang.loader import load_plan
    from planner.pipeline import compile_plan
    from planner.tuning import fusion_key
    from tests.dist_allreduce_norm import PLAN
    cp = compile_plan(load_plan("arn.yaml", text=PLAN.replace("world: 2", "world: 1")))
    w = torch.ones(32, dtype=torch.bfloat16)
    good = {"limits": {}, "fusion": {fusion_key("bf16", 32, 1): {"max_tokens": 8}}}
    ex = build_executor(cp, {"w": w}, device="cpu", tuning=good)
    assert ex.backends["normed"] == "torch"  # the fused kernel needs CUDA: the entry does not apply
    x, r = torch.randn(3, 32).bfloat16(), torch.randn(3, 32).bfloat16()
    out = ex(dims={"num_tokens": 3}, x=x, r=r)
    want = add_rmsnorm_ref(x, r, w, 1e-6)
    assert torch.equal(out["normed"], want[0]) and torch.equal(out["r_out"], want[1])
    with pytest.raises(BuildError, match="fusion key 'all_reduce_add_rmsnorm:bf16:N=32'"):
        build_executor(cp, {"w": w}, device="cpu", tuning={"limits": {}, "fusion": {
            "all_reduce_add_rmsnorm:bf16:N=32": {"max_tokens": 8}}})
