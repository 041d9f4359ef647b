"""Find repeated layers in a plan so a picture can draw one of them with a count.

A repeat is a run of `count` consecutive blocks of `period` ops (in plan order) where
block k's j-th op has the same signature as block 0's j-th op, and the data edges
inside every block connect the same positions. The signature is structural: the op id
with every number replaced by '#', the op kind, the extern fn, the stream and the
region/variant context (numbers replaced too). So `kda0/..` .. `kda91/..` (69 KDA
layers of 16 ops each) become one group "x69"; nothing is matched by name lists.

Plan order is the source order: a `for:` loop emits its iterations back to back even
when their data flow interleaves with another loop (KDA and MLA layers), which a
topological order would mix up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Repeat", "find_repeats", "template", "node_order"]

_NUM = re.compile(r"\d+")


def template(name: str) -> str:
    return _NUM.sub("#", name)


@dataclass
class Repeat:
    gid: str                      # stable group id, e.g. "rep0"
    period: int
    instances: list[list[str]]    # instances[k][j]: node ids of block k, in order
    index: dict = field(default_factory=dict)  # node -> (k, j)

    @property
    def count(self) -> int:
        return len(self.instances)

    def rep(self, node: str) -> str:
        """The node of the first block that stands for `node`."""
        k, j = self.index[node]
        return self.instances[0][j]


def node_order(cp) -> list[str]:
    """Graph nodes in plan order; ops made by passes go right after their last input's producer."""
    g = cp.graph
    pos = {op.id: (i, 0) for i, op in enumerate(cp.plan.ops) if op.id in g}
    rest = [v for v in g.nodes if v not in pos]
    # passes append nodes; resolve them in schedule (or insertion) order
    if cp.schedule:
        sched = {v: i for i, v in enumerate(cp.schedule)}
        rest.sort(key=lambda v: sched.get(v, len(sched)))
    for k, v in enumerate(rest, 1):
        preds = [pos[u][0] for u in g.predecessors(v) if u in pos]
        pos[v] = (max(preds) if preds else -1, k)
    return sorted(g.nodes, key=lambda v: pos[v])


def signature(g, v) -> tuple:
    d = g.nodes[v]
    op = d["op"]
    ctx = tuple((template(r), var) for r, var in d.get("ctx", ()))
    return (template(op.id), op.op, getattr(op, "fn", None), len(op.out), d.get("stream"), ctx,
            bool(getattr(op, "fused_from", None)))


def _internal_edges(g, block: list[str]) -> set:
    at = {v: j for j, v in enumerate(block)}
    return {(at[u], at[v]) for u in block for v in g.successors(u) if v in at}


def find_repeats(g, order: list[str], min_count: int = 3) -> list[Repeat]:
    """Maximal runs of >= min_count structurally identical consecutive blocks, left to right."""
    sig_ids: dict[tuple, int] = {}
    seq = [sig_ids.setdefault(signature(g, v), len(sig_ids)) for v in order]
    where: dict[int, list[int]] = {}
    for i, s in enumerate(seq):
        where.setdefault(s, []).append(i)
    n = len(seq)
    out: list[Repeat] = []
    i = 0
    while i < n:
        best = None  # (coverage, -period, count)
        for q in where[seq[i]]:
            p = q - i
            if p <= 0:
                continue
            if i + p * min_count > n:
                break
            block = seq[i:i + p]
            c = 1
            while seq[i + c * p:i + (c + 1) * p] == block:
                c += 1
            if c >= min_count and (best is None or (p * c, -p) > (best[0], -best[1])):
                best = (p * c, p, c)
        if best is not None:
            _, p, c = best
            blocks = [order[i + k * p:i + (k + 1) * p] for k in range(c)]
            # cut the run where a block's internal wiring differs from the first block's
            ref = _internal_edges(g, blocks[0])
            good = 1
            while good < c and _internal_edges(g, blocks[good]) == ref:
                good += 1
            if good >= min_count:
                blocks = blocks[:good]
                r = Repeat(f"rep{len(out)}", p, blocks)
                r.index = {v: (k, j) for k, b in enumerate(blocks) for j, v in enumerate(b)}
                out.append(r)
                i += p * good
                continue
        i += 1
    return out
