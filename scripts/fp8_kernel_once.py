#!/usr/bin/env python3
"""Run the fp8 skinny GEMM of one shape a few times with its default config (or one given), for a
profiler to look at one launch (scripts/gpu/fp8_ncu.sh runs it under Nsight Compute).

    python scripts/fp8_kernel_once.py --n 6144 --k 7168 --m 8 [--config '{"tiles": 2, ...}']
        [--kinds tensor,tensor]      scale kinds of x and w (default block,block)
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from executors.cute import fp8


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=6144)
    ap.add_argument("--k", type=int, default=7168)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--config", default=None, help="Fp8Config fields as JSON (default: the shipped default)")
    ap.add_argument("--kinds", default="block,block", help="scale kinds of x and w: tensor|row|block, tensor|col|block")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("fp8_kernel_once: needs a CUDA GPU", file=sys.stderr)
        return 1
    n, k, m = a.n, a.k, a.m
    cfg = fp8.Fp8Config.from_dict(json.loads(a.config)) if a.config else fp8.default_fp8_config(m, n, k)
    x = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    ka, kb = a.kinds.split(",")
    sa_shape = {"tensor": (), "row": (m, 1), "block": (m, k // 128)}[ka]
    sb_shape = {"tensor": (), "col": (n, 1), "block": (-(-n // 128), k // 128)}[kb]
    sa = torch.rand(sa_shape, device="cuda") * 0.01 + 0.002
    sb = torch.rand(sb_shape, device="cuda") * 0.01 + 0.002
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(a.calls):
        fp8.gemm_fp8(x, w, sa, sb, out, config=cfg)
    torch.cuda.synchronize()
    ref = fp8.dequant_reference(x, w, sa, sb)
    err = float((out.float() - ref).norm() / ref.norm())
    print(f"N={n} K={k} M={m} {ka}x{kb} {cfg.key()} rel err {err:.2e}")
    return 0 if err < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
