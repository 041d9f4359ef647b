"""Kimi-K3 sequence-parallel forward tail as an nn.Module: the final hidden state and
the EAGLE-3 aux states, sharded by token, gathered back to the full token count.

    tail = SPTail(group=tp_group, device="cuda", overrides={"tp_size": 4})
    final_full, aux_full = tail(final_shard, [aux2, aux46, aux90], num_tokens)

The plan (plans/k3_sp_tail.yaml) writes one all_gather per state; the compiled plan
packs them into one gather (cat, 1 all-gather, split), which must equal vLLM's
sp_all_gather(x)[:num_tokens] per state. num_tokens is passed explicitly: a shard
of ceil(T / tp) rows does not determine T.

Run as a script: spawns 2 gloo ranks on CPU (2 NCCL ranks with --cuda), runs the
module on random shards and compares with torch.cat of every rank's shard.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from executors import build_executor
from executors.tools.check import compile_for_run
from planner.lang.loader import load_plan

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["SPTail", "main"]

PLAN = ROOT / "plans" / "k3_sp_tail.yaml"


class SPTail(nn.Module):
    def __init__(self, group=None, device="cpu", overrides: dict | None = None):
        super().__init__()
        self.plan = load_plan(PLAN, overrides or {})
        self.executor = build_executor(compile_for_run(self.plan), {}, group=group, device=device)
        self.aux_names = [n for n in self.plan.inputs if n != "final"]

    def forward(self, final: torch.Tensor, aux: list[torch.Tensor], num_tokens: int):
        if len(aux) != len(self.aux_names):
            raise ValueError(f"expected {len(self.aux_names)} aux states ({self.aux_names}), got {len(aux)}")
        out = self.executor(dims={"num_tokens": num_tokens}, final=final, **dict(zip(self.aux_names, aux, strict=True)))
        return out["final_full"], [out[f"{n}_full"] for n in self.aux_names]


def _rank(rank, world, hidden, num_tokens, device):
    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    tail = SPTail(device=dev, overrides={"tp_size": world, "hidden": hidden})
    shard_rows = -(-num_tokens // world)

    def shard(r, i):  # every rank can rebuild every rank's shard: the check needs no extra collective
        g = torch.Generator().manual_seed(1000 * r + i)
        return torch.randn(shard_rows, hidden, generator=g).to(torch.bfloat16)
    n_states = 1 + len(tail.aux_names)
    mine = [shard(rank, i).to(dev) for i in range(n_states)]
    final_full, aux_full = tail(mine[0], mine[1:], num_tokens)
    ok = True
    for i, got in enumerate([final_full] + aux_full):
        want = torch.cat([shard(r, i) for r in range(world)], 0)[:num_tokens]
        ok &= bool(torch.equal(got.cpu(), want))
    return {"rank": rank, "ok": ok, "shape": list(final_full.shape),
            "gathers": sum(1 for v in tail.executor.compiled.schedule
                           if tail.executor.compiled.graph.nodes[v]["op"].op == "all_gather")}


def main(world: int = 2, hidden: int = 64, num_tokens: int = 13, device: str = "cpu") -> list[dict]:
    from executors.tools.ranks import run_ranks
    return run_ranks(_rank, world, hidden, num_tokens, device, backend="nccl" if device == "cuda" else "gloo",
                     timeout_s=180)


if __name__ == "__main__":
    dev = "cuda" if "--cuda" in sys.argv else "cpu"
    for r in main(device=dev):
        print(f"rank {r['rank']}: outputs {r['shape']} via {r['gathers']} all-gather(s),"
              f" equal to cat(shards)[:num_tokens]: {r['ok']}")
