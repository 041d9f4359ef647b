"""Rank body for the host-spanning tests (importable by spawn): a simulated topology through
LOCAL_WORLD_SIZE, as torchrun sets it on every node."""

from __future__ import annotations

import os

PLAN = """
plan: span
dims:
  num_tokens: 1..16
groups:
  tp: {world}
inputs:
  x: bf16[num_tokens, 8]
outputs: [y, z]
ops:
  - y: all_gather(x, tp{backend})
  - z: all_gather(x, tp, 1)
"""


def placement(rank, world, per_host):
    """-> what lookup decides for an all_gather on the world group and on a group of this host."""
    os.environ["LOCAL_WORLD_SIZE"] = str(per_host)
    import torch.distributed as dist

    from executors.backends import lookup
    from executors.collectives import Comm
    from executors.errors import BuildError
    from planner.ops import AllGather
    from planner.shapes import TensorSpec
    spec = [TensorSpec("x", (4, 8), "bf16")]
    world_comm = {"tp": Comm("tp", dist.group.WORLD, world, rank)}
    mine = [r for r in range(world) if r // per_host == rank // per_host]
    groups = [dist.new_group(list(range(h * per_host, (h + 1) * per_host))) for h in range(world // per_host)]
    local = {"tp": Comm("tp", groups[rank // per_host], len(mine), mine.index(rank))}
    out = {}
    for name, comms in (("world", world_comm), ("local", local)):
        auto = AllGather(op="all_gather", id="y", out=["y"], x="x", group="tp")
        out[f"{name}_auto"] = lookup(auto, spec, "cuda", ("p2p", "torch"), comms).backend
        explicit = AllGather(op="all_gather", id="y", out=["y"], x="x", group="tp", backend="p2p")
        try:
            out[f"{name}_explicit"] = lookup(explicit, spec, "cuda", None, comms).backend
        except BuildError as exc:
            out[f"{name}_explicit"] = f"BuildError: {exc}"
    out["build_p2p"] = build(rank, world, per_host, "p2p")
    out["build_auto"] = build(rank, world, per_host, None)
    return out


def build(rank, world, per_host, backend):
    """-> the run_check report, or the BuildError's text, for the plan above on CPU."""
    os.environ["LOCAL_WORLD_SIZE"] = str(per_host)
    from executors.errors import BuildError
    from executors.tools.check import run_check
    from tests.dist_plans import load_text
    text = PLAN.format(world=world, backend=f", backend={backend}" if backend else "")
    try:
        return run_check(lambda: load_text(text), rank=rank, num_tokens=5, seed=1)
    except BuildError as exc:
        return f"BuildError: {exc}"
