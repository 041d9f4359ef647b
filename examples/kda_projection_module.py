"""Kimi-K3 KDA decode projections as an nn.Module whose forward calls the compiled plan.

    block = KDAProjection(overrides={...}, device="cuda")
    mixed_qkv, g_proj, g1, beta = block(hidden_states)        # [M, hidden] bf16

The executor is built in __init__ (weights prepared once, executors.weights) and the forward
calls it as a plain function: torch.compile(block, fullgraph=True, dynamic=True) traces the
call as one custom op (executors.custom_op), so the same module runs eagerly, compiled, and
captured (torch.cuda.graph, mode="reduce-overhead", or a piecewise layout).

The plan (plans/k3_kda_projection.yaml) holds two variants: the sequential packed
GEMM, and the two-branch form (QKVG on the main stream, F_A/beta then F_B on the
shared aux stream) that the gate selects only while a CUDA graph is being captured
and M <= tuned.kda_two_branch_max. So eager calls run the packed path, and the
same module captured with torch.cuda.graph runs the overlapped one.

Run as a script: on CPU it runs eagerly on small random weights and prints the
variant taken and the error against plain torch math; on a GPU it also captures
the whole module in a CUDA graph and replays it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from executors import build_executor
from executors.tools.check import compile_for_run
from planner.lang.loader import load_plan

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["KDAProjection", "main"]

PLAN = ROOT / "plans" / "k3_kda_projection.yaml"


class KDAProjection(nn.Module):
    def __init__(self, overrides: dict | None = None, device="cpu", tuning: dict | None = None, seed: int = 0):
        super().__init__()
        self.plan = load_plan(PLAN, overrides or {})
        g = torch.Generator().manual_seed(seed)
        for name in self.plan.weights:
            shape = self.plan.tensors[name].shape
            w = (torch.randn(shape, generator=g) / shape[1] ** 0.5).to(torch.bfloat16)
            self.register_buffer(name, w.to(device))
        self.tuning = tuning
        # the reference copies above stay for .reference(); an engine keeps only the executor's
        # prepared weights (ex.weights), as vLLM's process_weights_after_loading does
        weights = {n: getattr(self, n) for n in self.plan.weights}
        self.executor = build_executor(compile_for_run(self.plan), weights, device=device, tuning=tuning)

    def forward(self, hidden_states: torch.Tensor):
        out = self.executor(x=hidden_states)
        return out["mixed_qkv"], out["g_proj"], out["g1"], out["beta"]

    def reference(self, x: torch.Tensor):
        """Plain torch: the packed GEMM, split, F_B GEMM."""
        p = self.plan.params
        proj = x @ self.w_packed.t()
        hc = p["head_cols"]
        f_a = proj[:, 4 * hc:4 * hc + p["fa_rank"]]
        return (proj[:, :3 * hc], proj[:, 3 * hc:4 * hc], f_a @ self.w_fb.t(),
                proj[:, 4 * hc + p["fa_rank"]:4 * hc + p["fa_rank"] + p["local_heads"]])


SMALL = {"hidden": 256, "kda_heads": 64, "head_dim": 16, "fa_rank": 32}  # tp 8: 8 local heads, 128 head cols


def _err(a, b):
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=False))


def main(device: str | None = None, m: int = 2) -> dict:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    block = KDAProjection(SMALL if device == "cpu" else None, device=device)
    x = torch.randn(m, block.plan.params["hidden"], device=device).to(torch.bfloat16)
    outs = block(x)
    result = {"device": device, "m": m, "eager_variant": block.executor.last_variants,
              "eager_max_err": _err(outs, block.reference(x))}
    compiled = torch.compile(block, fullgraph=True, dynamic=True)  # the executor call is one custom op
    result["compiled_max_err"] = _err(compiled(x), outs)
    if device == "cuda":
        static_x = x.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                block(static_x)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = block(static_x)
        result["captured_variant"] = dict(block.executor.last_variants)
        static_x.copy_(torch.randn_like(static_x, dtype=torch.float32).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        result["graph_max_err"] = _err(static_out, block.reference(static_x))
        # the compiled module under CUDA graph trees (what vLLM's full-graph mode and SGLang do)
        ro = torch.compile(block, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):
            got = ro(static_x)
        torch.cuda.synchronize()
        result["reduce_overhead_max_err"] = _err(got, block.reference(static_x))
    return result


if __name__ == "__main__":
    r = main()
    print(f"KDA projection on {r['device']}, M={r['m']}: eager variant {r['eager_variant']},"
          f" max |err| vs torch {r['eager_max_err']:.3g}; torch.compile'd vs eager {r['compiled_max_err']:.3g}")
    if "graph_max_err" in r:
        print(f"  captured variant {r['captured_variant']}, graph replay max |err| {r['graph_max_err']:.3g},"
              f" reduce-overhead max |err| {r['reduce_overhead_max_err']:.3g}")
