"""Per-call agreement on the dims (a debug switch): every rank all-gathers the dims of its call and
compares before the first collective runs, so a rank called with other dims is named instead of
making the collectives disagree in size ("Received data size doesn't match expected size").

On with build_executor(check_dims=True) or env PLANNER_AGREE_DIMS=1; off by default (one small
all_gather per call) and never inside a CUDA graph capture (a capture must not synchronise).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .collectives import distinct_groups

__all__ = ["DimsMismatch", "agree_on_dims", "dims_check_enabled"]


class DimsMismatch(RuntimeError):
    """Ranks called the executor with different dims; no collective was run."""


def dims_check_enabled(flag: bool | None) -> bool:
    if flag is not None:
        return bool(flag)
    return os.environ.get("PLANNER_AGREE_DIMS", "") not in ("", "0")


def agree_on_dims(plan_name: str, dims: dict, comms: dict) -> None:
    """All-gather the call's dims over every distinct bound process group; raise on any difference."""
    names = sorted(dims)
    for gname, c in distinct_groups(comms):
        n = dist.get_world_size(c.pg)
        mine = torch.tensor([int(dims[k]) for k in names] or [0], dtype=torch.int64)
        if str(dist.get_backend(c.pg)) == "nccl":
            mine = mine.cuda()
        parts = [torch.empty_like(mine) for _ in range(n)]
        dist.all_gather(parts, mine, group=c.pg)
        got = [tuple(p.cpu().tolist()) for p in parts]
        if len(set(got)) > 1:
            ref = got[0]
            differ = [r for r, g in enumerate(got) if g != ref]
            per = "; ".join(f"rank {r}: " + ", ".join(f"{k}={v}" for k, v in zip(names, g, strict=False))
                            for r, g in enumerate(got))
            raise DimsMismatch(f"plan '{plan_name}': ranks {differ} of group '{gname}' were called with other dims"
                               f" than rank 0 ({per}; this is rank {c.rank}); refusing to run the collectives")
