"""Plan groups bound to torch.distributed process groups; the collectives; plan-hash agreement.

A plan group (`groups: {tp: tp_size}`) is bound at build time to a process group
whose size must equal the plan's. Collectives run through torch.distributed (NCCL
on GPU, gloo on CPU). all_gather is rank-major along any dim, exactly like
torch.cat([x_rank0, x_rank1, ...], dim); with a dim-0 slice of the result that is
vLLM's sp_all_gather(x)[:full_num_tokens].

Before the first collective every rank all-gathers a hash of its compiled plan and
compares: a rank whose plan differs would otherwise issue a different collective
sequence and hang. Every rank sees every hash, so every rank raises the same
PlanMismatch naming the differing ranks.
"""

from __future__ import annotations

import hashlib
import json

import torch
import torch.distributed as dist

__all__ = ["Comm", "bind_groups", "plan_hash", "agree_on_plan", "PlanMismatch", "GroupError"]


class PlanMismatch(RuntimeError):
    """Ranks compiled different plans; nothing was run."""


class GroupError(ValueError):
    """A plan group cannot be bound to the given process group."""


_REDUCE = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
           "avg": dist.ReduceOp.AVG}  # NCCL only: executors.backends.torch_ops emulates avg on gloo
# the *_single names replace the deprecated *_into_tensor ones in newer torch
_AG_TENSOR = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_RS_TENSOR = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Comm:
    """One plan group on this rank. size 1 without a process group is the identity."""

    def __init__(self, name: str, pg, size: int, rank: int):
        self.name, self.pg, self.size, self.rank = name, pg, size, rank
        backend = dist.get_backend(pg) if pg is not None else "none"
        # gloo has no flat-tensor gather on older torch: use the list form there
        self.list_form = str(backend) == "gloo"

    def __repr__(self) -> str:
        return f"Comm({self.name}, size={self.size}, rank={self.rank})"

    def all_gather(self, x, dim: int, out=None):
        if self.size == 1:
            return x if out is None else out.copy_(x)
        x = x.contiguous()
        d = dim % x.dim()
        if self.list_form:
            parts = [torch.empty_like(x) for _ in range(self.size)]
            dist.all_gather(parts, x, group=self.pg)
            r = torch.cat(parts, d)
            return r if out is None else out.copy_(r)
        if d == 0:
            buf = out if out is not None and out.is_contiguous() else x.new_empty((self.size * x.shape[0],) + tuple(x.shape[1:]))
            _AG_TENSOR(buf, x, group=self.pg)
            return buf if out is None or buf is out else out.copy_(buf)
        # gather rank-major on a new leading axis, then fold it into `d`
        buf = x.new_empty((self.size,) + tuple(x.shape))
        _AG_TENSOR(buf.view(-1, *x.shape[1:]) if x.dim() > 0 else buf, x, group=self.pg)
        shape = list(x.shape)
        shape[d] *= self.size
        r = buf.movedim(0, d).reshape(shape)
        return r if out is None else out.copy_(r)

    def reduce_scatter(self, x, dim: int, reduce: str, out=None):
        if self.size == 1:
            return x if out is None else out.copy_(x)
        d = dim % x.dim()
        src = x.movedim(d, 0).contiguous() if d else x.contiguous()
        shape = list(src.shape)
        shape[0] //= self.size
        buf = src.new_empty(shape)
        _RS_TENSOR(buf, src, op=_REDUCE[reduce], group=self.pg)
        r = buf.movedim(0, d) if d else buf
        return r if out is None else out.copy_(r)

    def all_reduce(self, x, reduce: str, out=None):
        if self.size == 1:
            return x if out is None else out.copy_(x)
        y = out if out is not None and out.is_contiguous() else x.clone(memory_format=torch.contiguous_format)
        if y is out:
            y.copy_(x)
        dist.all_reduce(y, op=_REDUCE[reduce], group=self.pg)
        return y if out is None or y is out else out.copy_(y)


def bind_groups(plan_groups: dict[str, int], group) -> dict[str, Comm]:
    """group: None (default group when initialized), a ProcessGroup, or {plan group name: ProcessGroup}."""
    out = {}
    for name, size in plan_groups.items():
        pg = group.get(name) if isinstance(group, dict) else group
        if isinstance(group, dict) and name not in group:
            if size != 1:
                raise GroupError(f"plan group '{name}' (size {size}) has no process group in the group= dict"
                                 f" (given: {sorted(group)})")
        if pg is None and size != 1:
            if not dist.is_available() or not dist.is_initialized():
                raise GroupError(f"plan group '{name}' has size {size} but torch.distributed is not initialized;"
                                 " initialize it or pass group=")
            pg = dist.group.WORLD
        if pg is None:
            out[name] = Comm(name, None, 1, 0)
            continue
        actual = dist.get_world_size(pg)
        out[name] = Comm(name, pg, actual, dist.get_rank(pg))
        out[name].expected = size
    return out


def check_group_sizes(comms: dict[str, Comm]) -> None:
    for name, c in comms.items():
        want = getattr(c, "expected", c.size)
        if want != c.size:
            raise GroupError(f"plan group '{name}' has size {want} but the process group bound to it has"
                             f" {c.size} ranks (run with --world-size {want}, or --set the plan's size to {c.size})")


def plan_hash(cp) -> str:
    """sha256 of what decides the collective sequence and results: params, groups, ops, schedule, streams."""
    g = cp.graph
    desc = {
        "plan": cp.plan.name,
        "params": {k: v for k, v in sorted(cp.plan.params.items())},
        "groups": dict(sorted(cp.plan.groups.items())),
        "dims": {k: [d.lo, d.hi] for k, d in sorted(cp.plan.dims.items())},
        "ops": [[v, g.nodes[v]["op"].op, sorted(g.nodes[v]["op"].inputs()), list(g.nodes[v]["op"].out),
                 json.dumps(g.nodes[v]["op"].attrs(), sort_keys=True, default=str), g.nodes[v]["stream"],
                 [list(c) for c in g.nodes[v]["ctx"]]] for v in cp.schedule],
    }
    return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()


def agree_on_plan(digest: str, comms: dict[str, Comm]) -> None:
    """All-gather the plan hash over every distinct bound process group; raise on any difference."""
    seen = []
    for name in sorted(comms):
        c = comms[name]
        if c.pg is None or any(c.pg is p for p in seen):
            continue
        seen.append(c.pg)
        n = dist.get_world_size(c.pg)
        mine = torch.tensor(list(bytes.fromhex(digest)), dtype=torch.uint8)
        if str(dist.get_backend(c.pg)) == "nccl":
            mine = mine.cuda()
        parts = [torch.empty_like(mine) for _ in range(n)]
        dist.all_gather(parts, mine, group=c.pg)
        hashes = [bytes(p.cpu().tolist()).hex() for p in parts]
        if len(set(hashes)) > 1:
            counts: dict[str, list[int]] = {}
            for r, h in enumerate(hashes):
                counts.setdefault(h, []).append(r)
            ref = max(counts, key=lambda h: (len(counts[h]), -counts[h][0]))
            differ = [r for r, h in enumerate(hashes) if h != ref]
            raise PlanMismatch(
                f"ranks {differ} of group '{name}' compiled a different plan than ranks {counts[ref]}"
                f" (plan hashes: " + ", ".join(f"rank {r}: {h[:12]}" for r, h in enumerate(hashes))
                + f"; this is rank {c.rank}); refusing to run")
