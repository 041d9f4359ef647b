"""Rank body for the all_reduce_add_rmsnorm gloo test (importable by spawn)."""

from __future__ import annotations

PLAN = """
plan: arn
params:
  hidden: 32
  world: 2
dims:
  num_tokens: 1..8
groups:
  tp: world
inputs:
  x: bf16[num_tokens, hidden]
  r: bf16[num_tokens, hidden]
weights:
  w: bf16[hidden]
outputs: [normed, r_out]
ops:
  - s: all_reduce(x, tp)
  - normed, r_out: add_rmsnorm(s, r, w, eps='1e-6')
"""


def fused_vs_formula(rank, world, num_tokens):
    """The compiled (fused) plan against sum over ranks + residual, RMS-normalized in fp32."""
    import torch

    from executors.lowering import build_executor
    from executors.tools.check import compile_for_run, make_data
    from planner.lang.loader import load_plan
    plan = load_plan("arn.yaml", text=PLAN.replace("world: 2", f"world: {world}"))
    cp = compile_for_run(plan)
    kinds = sorted(cp.graph.nodes[v]["op"].op for v in cp.graph.nodes)
    b = {"num_tokens": num_tokens}
    every = [make_data(plan, b, 7, q, "cpu") for q in range(world)]
    ins, weights = every[rank]
    ex = build_executor(cp, weights, device="cpu")
    out = ex(dims=b, **ins)
    s = sum(e[0]["x"].float() for e in every).to(torch.bfloat16).float() + ins["r"].float()
    want = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * weights["w"].float()
    return {"kinds": kinds, "backend": ex.backends["normed"],
            "normed_err": float((out["normed"].float() - want).abs().max()),
            "r_out_err": float((out["r_out"].float() - s).abs().max()), "r_scale": float(s.abs().max()),
            "scale": float(want.abs().max())}
