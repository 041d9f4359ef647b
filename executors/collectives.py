"""Plan groups bound to torch.distributed process groups; the collectives; plan-hash agreement.

A plan group (`groups: {tp: tp_size}`) is bound at build time to a process group
whose size must equal the plan's. Collectives run through torch.distributed (NCCL
on GPU, gloo on CPU). all_gather is rank-major along any dim, exactly like
torch.cat([x_rank0, x_rank1, ...], dim); with a dim-0 slice of the result that is
vLLM's sp_all_gather(x)[:full_num_tokens].

Before the first collective every rank all-gathers a hash of what it is about to run
(plan_description: params, groups, tensors' dtypes and shapes, ops, events, tuned limits,
backend table, pass configuration) and compares: a rank whose plan differs would
otherwise issue a different collective sequence and hang, or exchange other bytes.
On a difference every rank gathers every description, so every rank raises the same
PlanMismatch naming the differing ranks and the first line that differs.
"""

from __future__ import annotations

import hashlib
import json

import torch
import torch.distributed as dist

__all__ = ["Comm", "bind_groups", "plan_description", "plan_hash", "first_difference", "agree_on_plan",
           "PlanMismatch", "GroupError", "check_shared_groups"]


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
        # the planner declares a collective's result contiguous (a later view relies on it): a size-1
        # group must not hand back a strided input as it is
        if self.size == 1:
            return x.contiguous() if out is None else out.copy_(x)
        if x.element_size() == 1 and x.dtype != torch.uint8 and not x.is_complex():
            # fp8 values travel as their bytes (gloo, and NCCL builds without fp8 types, refuse them)
            r = self.all_gather(x.view(torch.uint8), dim, None if out is None else out.view(torch.uint8))
            return r.view(x.dtype) if out is None else out
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
            return x.contiguous() if out is None else out.copy_(x)
        d = dim % x.dim()
        src = x.movedim(d, 0).contiguous() if d else x.contiguous()
        shape = list(src.shape)
        shape[0] //= self.size
        buf = src.new_empty(shape)
        _RS_TENSOR(buf, src, op=_REDUCE[reduce], group=self.pg)
        r = buf.movedim(0, d).contiguous() if d else buf
        return r if out is None else out.copy_(r)

    def all_reduce(self, x, reduce: str, out=None):
        if self.size == 1:
            return x.contiguous() if out is None else out.copy_(x)
        y = out if out is not None and out.is_contiguous() else x.clone(memory_format=torch.contiguous_format)
        if y is out:
            y.copy_(x)
        dist.all_reduce(y, op=_REDUCE[reduce], group=self.pg)
        return y if out is None or y is out else out.copy_(y)


def bind_groups(plan_groups: dict[str, int], group) -> dict[str, Comm]:
    """group: None (default group when initialized), a ProcessGroup, or {plan group name: ProcessGroup}."""
    def is_pg(x) -> bool:
        return isinstance(x, dist.ProcessGroup) if dist.is_available() else False
    if group is not None and not isinstance(group, dict) and not is_pg(group):
        raise GroupError(f"group= must be a torch.distributed ProcessGroup or {{plan group: ProcessGroup}},"
                         f" got {type(group).__name__} {group!r:.40}")
    if isinstance(group, dict):
        for k, v in group.items():
            if v is not None and not is_pg(v):
                raise GroupError(f"group['{k}'] must be a torch.distributed ProcessGroup (dist.new_group(...)),"
                                 f" got {type(v).__name__} {v!r:.40}")
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


def check_shared_groups(cp, comms: dict[str, Comm], device) -> None:
    """Plan groups bound to one process group are one communicator: the planner keeps each group's
    collectives on one stream, and this holds the same across the names that share a group. On
    CPU there are no streams (program order), so sharing is fine there."""
    from planner.ops import COLLECTIVES
    if torch.device(device).type != "cuda":
        return
    by_pg: dict[int, list[str]] = {}
    for name, c in comms.items():
        if c.pg is not None and c.size > 1:
            by_pg.setdefault(id(c.pg), []).append(name)
    shared = {n: names for names in by_pg.values() if len(names) > 1 for n in names}
    if not shared:
        return
    plans = [cp] + [p["cp"] for p in cp.bucket_plans if p.get("cp") is not None]
    for one in plans:
        first: dict[tuple, tuple] = {}
        for v in one.schedule:
            op = one.graph.nodes[v]["op"]
            if op.op not in COLLECTIVES or op.group not in shared:
                continue
            key, s = tuple(shared[op.group]), one.graph.nodes[v]["stream"]
            u, su, gu = first.setdefault(key, (v, s, op.group))
            if su != s:
                raise GroupError(
                    f"plan groups {' and '.join(repr(n) for n in key)} are bound to one process group, and their"
                    f" collectives run on two streams ({u} over '{gu}' on {su}, {v} over '{op.group}' on {s}):"
                    " one communicator driven from two streams can run them in different orders on different"
                    " ranks and hang; bind each plan group to its own process group (group={name: pg}),"
                    " or pin these collectives to one stream")


def check_group_sizes(comms: dict[str, Comm]) -> None:
    for name, c in comms.items():
        want = getattr(c, "expected", c.size)
        if want != c.size:
            raise GroupError(f"plan group '{name}' has size {want} but the process group bound to it has"
                             f" {c.size} ranks (run with --world-size {want}, or --set the plan's size to {c.size})")


def plan_description(cp, tuning=None, backend_prefs=None, problem: str = "") -> list[tuple[str, list[str]]]:
    """What a rank is about to run, as ordered sections of canonical lines.

    Everything that changes the collectives issued or the values exchanged: params, groups,
    dims, the tuned limits in effect (the plan's, overridden by `tuning` as given to
    build_executor), the backend table (backend_prefs and a tuning file's per-signature
    table), the pass configuration and passes run, every tensor's dtype and normalised
    shape, and every op of the schedule with its attributes, stream, guards and events.
    tuning: the tuning as resolved (executors.tuning.resolve_tuning) or {limit: int};
    problem: a build error this rank will raise after agreeing (so a lone failure is named).
    """
    from planner.shapes import fmt_dim
    plan, g = cp.plan, cp.graph

    def canon(x) -> str:
        return json.dumps(x, sort_keys=True, default=str, separators=(",", ":"))

    if isinstance(tuning, str):
        with open(tuning) as f:
            tuning = json.load(f)
    table = {}
    if isinstance(tuning, dict) and "limits" in tuning:
        table = tuning.get("backends") or {}
        tuning = tuning["limits"]
    tuned = dict(plan.tuned)
    tuned.update({k: v for k, v in (tuning or {}).items()})
    tensors = []  # inputs and weights first: a difference there is the cause of later ones
    for name in [*plan.inputs, *plan.weights, *sorted(set(cp.tensors) - set(plan.inputs) - set(plan.weights))]:
        t = cp.tensors[name]
        dims = ", ".join(str(d) if isinstance(d, int) else fmt_dim(d) for d in t.shape)
        tensors.append(f"{name}: {t.dtype}[{dims}] ({t.kind}{'' if t.contiguous else ', strided'})")
    ops = []
    for v in cp.schedule:
        d, op = g.nodes[v], g.nodes[v]["op"]
        ops.append(f"{v}: {op.op}({', '.join(op.inputs())}) -> {', '.join(op.out)} {canon(op.attrs())}"
                   f" stream={d['stream']} ctx={canon([list(c) for c in d['ctx']])}"
                   f" waits={canon(d.get('waits', []))} records={canon(d.get('records', []))}"
                   f" slot={canon(d.get('out_slot'))}")
    return [
        ("build errors", [problem] if problem else []),  # first: it explains the rest
        ("plan", [plan.name]),
        ("params", [f"{k}={canon(v)}" for k, v in sorted(plan.params.items())]),
        ("groups", [f"{k}={v}" for k, v in sorted(plan.groups.items())]),
        ("dims", [f"{k}={d.lo}..{d.hi}" for k, d in sorted(plan.dims.items())]),
        ("tuned limits", [f"{k}={canon(v)}" for k, v in sorted(tuned.items())]),
        ("backends", [f"prefs={canon(list(backend_prefs) if backend_prefs is not None else None)}"]
         + [f"{k}={canon(v)}" for k, v in sorted(table.items())]),
        ("passes", [f"run={canon(list(cp.passes_run))}"]
         + [f"{k}={canon(v)}" for k, v in sorted((cp.report.get("config") or {}).items())]),
        ("tensors", tensors),
        ("ops", ops),
        ("bucket plans", _bucket_plan_lines(cp, canon)),
    ]


def _bucket_plan_lines(cp, canon) -> list[str]:
    """Each per-range stream plan (planner/passes/bucket_plans.py): its range and, op by op, its
    stream, waits and records."""
    out = []
    for p in cp.bucket_plans:
        own = p.get("cp")
        if own is None:
            out.append(f"{p['dim']}={p['lo']}..{p['hi']}: the plan's own")
            continue
        g = own.graph
        out.append(f"{p['dim']}={p['lo']}..{p['hi']}: " + "; ".join(
            f"{v} stream={g.nodes[v]['stream']} waits={canon(g.nodes[v].get('waits', []))}"
            f" records={canon(g.nodes[v].get('records', []))}" for v in own.schedule)
            + f"; exit={canon(list(own.exit_waits))}")
    return out


def plan_hash(cp, tuning=None, backend_prefs=None) -> str:
    """sha256 of plan_description(): equal on two ranks exactly when they will run the same thing."""
    return _digest(plan_description(cp, tuning, backend_prefs))


def _digest(desc) -> str:
    return hashlib.sha256(json.dumps(desc, separators=(",", ":")).encode()).hexdigest()


def first_difference(descs: list) -> str | None:
    """The first line (in section order) on which the ranks' descriptions differ, per rank."""
    names = [n for n, _ in descs[0]]
    for name in names:
        secs = [dict(d).get(name, []) for d in descs]
        for i in range(max(len(s) for s in secs)):
            lines = [s[i] if i < len(s) else "(nothing)" for s in secs]
            if len(set(lines)) > 1:
                return f"{name}: " + "; ".join(f"rank {r} has {line}" for r, line in enumerate(lines))
    return None


def _gather_bytes(data: bytes, pg, cuda: bool) -> list[bytes]:
    """all_gather of variable-length bytes over pg (lengths first, then padded payloads)."""
    n = dist.get_world_size(pg)
    dev = "cuda" if cuda else "cpu"
    size = torch.tensor([len(data)], dtype=torch.int64, device=dev)
    sizes = [torch.empty_like(size) for _ in range(n)]
    dist.all_gather(sizes, size, group=pg)
    lens = [int(x.item()) for x in sizes]
    buf = torch.zeros(max(lens), dtype=torch.uint8)
    buf[:len(data)] = torch.tensor(list(data), dtype=torch.uint8) if data else buf[:0]
    buf = buf.to(dev)
    parts = [torch.empty_like(buf) for _ in range(n)]
    dist.all_gather(parts, buf, group=pg)
    return [bytes(p[:m].cpu().tolist()) for p, m in zip(parts, lens, strict=True)]


def distinct_groups(comms: dict[str, Comm]):
    """(group name, Comm) once per distinct bound process group, in name order (two plan groups
    bound to the same torch process group are checked once)."""
    seen = []
    for name in sorted(comms):
        c = comms[name]
        if c.pg is None or any(c.pg is p for p in seen):
            continue
        seen.append(c.pg)
        yield name, c


def agree_on_plan(desc, comms: dict[str, Comm]) -> None:
    """Agree on the plan over every distinct bound process group before the first collective.

    desc: plan_description() (or a bare hash string). Every rank all-gathers its hash; on any
    difference every rank all-gathers every rank's description, so every rank raises the same
    PlanMismatch naming the differing ranks and the first line on which they differ.
    """
    digest = desc if isinstance(desc, str) else _digest(desc)
    for name, c in distinct_groups(comms):
        cuda = str(dist.get_backend(c.pg)) == "nccl"
        hashes = [h.hex() for h in _gather_bytes(bytes.fromhex(digest), c.pg, cuda)]
        if len(set(hashes)) > 1:
            counts: dict[str, list[int]] = {}
            for r, h in enumerate(hashes):
                counts.setdefault(h, []).append(r)
            ref = max(counts, key=lambda h: (len(counts[h]), -counts[h][0]))
            differ = [r for r, h in enumerate(hashes) if h != ref]
            why = None
            if not isinstance(desc, str):
                texts = _gather_bytes(json.dumps(desc).encode(), c.pg, cuda)
                why = first_difference([[tuple(x) for x in json.loads(t)] for t in texts])
            raise PlanMismatch(
                f"ranks {differ} of group '{name}' compiled a different plan than ranks {counts[ref]}"
                + (f"; first difference in {why}" if why else "")
                + " (plan hashes: " + ", ".join(f"rank {r}: {h[:12]}" for r, h in enumerate(hashes))
                + f"; this is rank {c.rank}); refusing to run")
