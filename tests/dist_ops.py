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


MIXED = """
plan: mixed
params: {hidden: 16, tp_size: 4, ep_size: 2}
dims: {num_tokens: 1..8}
groups: {tp: tp_size, ep: ep_size}
inputs:
  x: fp32[num_tokens, hidden]
outputs: [a, b]
ops:
  - a: all_gather(x, tp)
  - b: all_reduce(x, ep, stream=aux)
"""


def mixed_groups(rank, world, num_tokens):
    """planner run's groups (run_groups) for a plan whose groups differ in size: the gather spans
    every rank, the reduce this rank's block of 2; and the same plan with both plan groups bound
    to the default group builds on CPU but is refused for CUDA (one process group, two streams)."""
    import torch

    from executors.collectives import GroupError
    from executors.lowering import build_executor
    from executors.tools.check import compile_for_run, make_data
    from executors.tools.ranks import run_groups
    from planner.lang.loader import load_plan
    load = lambda: load_plan("mixed.yaml", text=MIXED)  # noqa: E731
    plan = load()
    b = {"num_tokens": num_tokens}
    every = [make_data(plan, b, 5, r, "cpu")[0]["x"] for r in range(world)]
    ex = build_executor(compile_for_run(load()), {}, device="cpu", group=run_groups(plan.groups, world))
    outs = ex(dims=b, x=every[rank])
    block = rank // 2 * 2
    got = {"a": bool(torch.equal(outs["a"], torch.cat(every, 0))),
           "b": bool(torch.allclose(outs["b"], every[block] + every[block + 1], atol=1e-6))}
    from executors.collectives import bind_groups, check_shared_groups
    same = lambda: load_plan("same.yaml", text=MIXED.replace("ep_size: 2", "ep_size: 4"))  # noqa: E731
    build_executor(compile_for_run(same()), {}, device="cpu")  # both on the default group: no streams on CPU
    try:  # what a CUDA build of the same binding checks
        check_shared_groups(compile_for_run(same()), bind_groups(same().groups, None), "cuda")
        got["shared"] = "built"
    except GroupError as exc:
        got["shared"] = str(exc)
    return got
