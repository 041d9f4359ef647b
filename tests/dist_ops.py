"""Rank bodies for the all_to_all / reduce=avg gloo tests (importable by spawn)."""

from __future__ import annotations

PLAN = """
plan: ep
params:
  hidden: 16
  world: 2
dims:
  num_tokens: 1..8
groups:
  ep: world
inputs:
  x: fp32[world * num_tokens, hidden]
  cnt: int32[world]
  v: fp32[num_tokens, hidden]
outputs: [y, got, avg, rs_avg]
ops:
  - y, got: all_to_all(x, ep, splits=num_tokens, counts=cnt)
  - avg: all_reduce(v, ep, reduce=avg)
  - rs_avg: reduce_scatter(v, ep, dim=1, reduce=avg)
"""


def a2a_and_avg(rank, world, num_tokens):
    """compiled == reference, and the values checked against every rank's inputs."""
    import torch

    from executors.tools.check import make_data, run_check
    from planner.lang.loader import load_plan
    text = PLAN.replace("world: 2", f"world: {world}")
    load = lambda: load_plan("ep.yaml", text=text)  # noqa: E731
    rep = run_check(load, rank=rank, num_tokens=num_tokens, seed=3)
    plan = load()
    b = rep["dims"]
    from executors.lowering import build_executor
    from executors.tools.check import compile_for_run
    mine = make_data(plan, b, 3, rank, "cpu")[0]
    ex = build_executor(compile_for_run(load()), {}, device="cpu")
    outs = ex(dims=b, **mine)
    every = [make_data(plan, b, 3, r, "cpu")[0] for r in range(world)]
    t = b["num_tokens"]
    want_y = torch.cat([e["x"][rank * t:(rank + 1) * t] for e in every], 0)
    want_cnt = torch.stack([e["cnt"][rank] for e in every])
    want_avg = sum(e["v"] for e in every) / world
    rep["independent"] = {
        "y": bool(torch.equal(outs["y"], want_y)),
        "got": bool(torch.equal(outs["got"], want_cnt)),
        "avg": bool(torch.allclose(outs["avg"], want_avg, atol=1e-6)),
        "rs_avg": bool(torch.allclose(outs["rs_avg"], want_avg.chunk(world, 1)[rank], atol=1e-6)),
    }
    return rep
