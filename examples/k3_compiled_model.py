"""Both shipped Kimi-K3 paths in one nn.Module, compiled with torch.compile as engines do.

    model = K3Block(layers=2, group=tp_group, device="cuda")
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    outs = compiled(x, final, aux2, aux46, aux90)     # x: [T, hidden]; shards: [ceil(T / tp), hidden]

Each KDA layer (plans/k3_kda_projection.yaml) and the SP tail (plans/k3_sp_tail.yaml) is a
built executor called as a plain function; under Dynamo each call is one custom op
(executors.custom_op), so the compiled graph has no break and one graph serves every token
count (mark the token dim unbacked, torch._dynamo.decorators.mark_unbacked, or Dynamo
specializes T = 1 and compiles once more there).

Run as a script: 2 gloo ranks on CPU (NCCL with --cuda), T = 1..16, compiled vs eager, and
the number of Dynamo graphs and graph breaks; with --cuda also the compiled model captured in
one CUDA graph and replayed on fresh inputs.
"""

from __future__ import annotations

import sys

# kda_projection_module, sp_tail_module: sibling examples (running this file puts its folder on sys.path)
from kda_projection_module import SMALL, KDAProjection
from sp_tail_module import SPTail
from torch import nn

__all__ = ["K3Block", "main"]


class K3Block(nn.Module):
    """`layers` KDA projection layers (each feeds its mixed_qkv's first `hidden` columns to the
    next) and the SP tail over four token-sharded states."""

    def __init__(self, layers: int = 2, group=None, device="cpu", kda_overrides: dict | None = None,
                 sp_overrides: dict | None = None):
        super().__init__()
        self.kda = nn.ModuleList(KDAProjection(kda_overrides, device=device, seed=i) for i in range(layers))
        self.tail = SPTail(group=group, device=device, overrides=sp_overrides)
        self.hidden = self.kda[0].plan.params["hidden"]

    def forward(self, x, final, aux2, aux46, aux90):
        h, outs = x, []
        for layer in self.kda:
            mixed_qkv, g_proj, g1, beta = layer(h)
            outs += [mixed_qkv, g_proj, g1, beta]
            h = mixed_qkv[:, :self.hidden].contiguous()
        final_full, aux_full = self.tail(final, [aux2, aux46, aux90], x.shape[0])
        return outs + [final_full] + aux_full


def _rank(rank, world, t_max, hidden, device):
    import torch._dynamo

    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    model = K3Block(2, device=dev, kda_overrides=SMALL if device == "cpu" else None,
                    sp_overrides={"tp_size": world, "hidden": hidden})
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    torch._dynamo.utils.counters.clear()
    equal = []
    for t in [4] + list(range(1, t_max + 1)):
        g = torch.Generator().manual_seed(100 * t + rank)
        x = torch.randn(t, model.hidden, generator=g).to(torch.bfloat16).to(dev)
        rows = -(-t // world)
        shards = [torch.randn(rows, hidden, generator=g).to(torch.bfloat16).to(dev) for _ in range(4)]
        if len(equal) == 0:  # the first (dynamic) compile: token dims unbacked, no 0/1 specialization
            torch._dynamo.decorators.mark_unbacked(x, 0)
            for s in shards:
                torch._dynamo.decorators.mark_unbacked(s, 0)
        want = model(x, *shards)
        got = compiled(x, *shards)
        equal.append(all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
                     and [tuple(a.shape) for a in want] == [tuple(b.shape) for b in got])
    c = torch._dynamo.utils.counters
    captured = None
    if device == "cuda":  # the compiled model captured whole in a CUDA graph, replayed on fresh inputs
        t = 8
        static = [torch.zeros(t, model.hidden, device=dev, dtype=torch.bfloat16)] + [
            torch.zeros(-(-t // world), hidden, device=dev, dtype=torch.bfloat16) for _ in range(4)]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                compiled(*static)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = compiled(*static)
        g = torch.Generator().manual_seed(7 + rank)
        for a in static:
            a.copy_(torch.randn(a.shape, generator=g).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        want = model(*static)
        captured = all(torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2) for a, b in zip(want, outs, strict=True))
    return {"rank": rank, "equal": equal, "captured_equal": captured, "graphs": c["stats"]["unique_graphs"],
            "breaks": sum(c["graph_break"].values()), "layout_copies": sum(m.executor.op_layout_copies
                                                                           for m in model.kda)}


def main(world: int = 2, t_max: int = 16, hidden: int = 32, device: str = "cpu") -> list[dict]:
    from executors.tools.ranks import run_ranks
    return run_ranks(_rank, world, t_max, hidden, device, backend="nccl" if device == "cuda" else "gloo",
                     timeout_s=600, coll_timeout_s=300)


if __name__ == "__main__":
    dev = "cuda" if "--cuda" in sys.argv else "cpu"
    for r in main(device=dev):
        print(f"rank {r['rank']}: compiled == eager at T = 1..{len(r['equal']) - 1}: {all(r['equal'])};"
              f" {r['graphs']} Dynamo graph(s), {r['breaks']} graph break(s)"
              + ("" if r["captured_equal"] is None else f"; captured == eager: {r['captured_equal']}"))
