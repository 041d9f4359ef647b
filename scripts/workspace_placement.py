#!/usr/bin/env python3
"""Does the fused KDA step's speed depend on where its workspace lies? (diagnostics, GPU)

The consumers of the fused kernel spin on tagged f_a pairs in the workspace, so the L2 slice
those lines hash to sits on the step's critical path. bench_kda_step saw the same kernel 0.3-0.5
us apart between paths (scripts/graph_kernels.py: identical launches); each path captures on
its own stream and so gets its own workspace. This times kda_fused_step with the workspace at
`--n` different 64 KiB-aligned offsets of one buffer (same x, weights, outputs), CUDA-graph
replay, 4 weight sets, paths in random order per trial, and prints the spread per M.
    python scripts/workspace_placement.py [--ms 4,8,12] [--n 12]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import executors.cute as ec
from executors.cute.config import fused_workspace_words
from executors.tools.timing import time_graphs

ROOT = Path(__file__).resolve().parent.parent

NP, NQ, NFB, NFA, H = 6288, 6144, 1536, 128, 7168


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="4,8,12")
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--trials", type=int, default=15)
    a = ap.parse_args()
    if not ec.available():
        print("workspace_placement: needs an sm_90 GPU and cutlass", file=sys.stderr)
        return 2
    g = torch.Generator(device="cuda").manual_seed(0)
    for m in (int(v) for v in a.ms.split(",")):
        x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16, generator=g)
        wp = [torch.randn(NP, H, device="cuda", dtype=torch.bfloat16, generator=g) * H ** -0.5 for _ in range(4)]
        wb = [torch.randn(NFB, NFA, device="cuda", dtype=torch.bfloat16, generator=g) * NFA ** -0.5 for _ in range(4)]
        out = [torch.empty(m, NP, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        g1 = [torch.empty(m, NFB, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        cfg = ec.default_fused_config(m, NP, H, NFA, NQ)
        words = fused_workspace_words(cfg, NP, NQ, NFA, NFB)
        span = 16384  # int32 words = 64 KiB
        buf = torch.zeros(a.n * span + words, device="cuda", dtype=torch.int32)
        fns = {}
        for j in range(a.n):
            ws = buf[j * span:j * span + words]
            fns[f"off{j * 64}K"] = (lambda i, ws=ws: ec.kda_fused_step(
                x, wp[i % 4], wb[i % 4], out[i % 4], g1[i % 4], fa_col=NQ, config=cfg, workspace=ws))
        ref = x.float() @ wp[0].float().t()
        fns["off0K"](0)
        torch.cuda.synchronize()
        err = float((g1[0].float() - ref[:, NQ:NQ + NFA] @ wb[0].float().t()).norm() / g1[0].float().norm())
        t = time_graphs(fns, iters=20, trials=a.trials)
        v = sorted(t.values())
        print(f"M={m} {cfg.key()} workspace@{buf.data_ptr() % (1 << 21):#x} (mod 2 MiB) g1 rel err {err:.1e}: "
              f"min {v[0]:.2f} median {v[len(v) // 2]:.2f} max {v[-1]:.2f} us/step | "
              + " ".join(f"{k} {u:.2f}" for k, u in t.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
