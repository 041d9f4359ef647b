#!/usr/bin/env python3
"""FlashInfer mm_bf16 smoke test on a GPU: each sm_90 sub-backend (cudnn, cutile, tinygemm, cublaslt) at the
Kimi-K3 KDA shapes, with its first-call time (JIT builds) and cosine vs an fp32 reference on NaN-poisoned
outputs. Timing is `planner tune`'s job (it times these sub-backends inside graph replays).
Exit code 1 if any sub-backend that ran gave a wrong result; a sub-backend that cannot run is reported."""
import sys
import time

import flashinfer
import torch
from flashinfer import mm_bf16

print("flashinfer", flashinfer.__version__, flush=True)
torch.manual_seed(0)
bad = 0
for sub in ("cudnn", "cutile", "tinygemm", "cublaslt"):
    for (m, n, k) in ((8, 6144, 7168), (16, 6288, 7168), (8, 1536, 128)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        t0 = time.time()
        try:
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            r = mm_bf16(x, w.t(), out=out, out_dtype=torch.bfloat16, backend=sub)
            torch.cuda.synchronize()
            ref = x.float() @ w.float().t()
            cos = torch.nn.functional.cosine_similarity(r.float().flatten(), ref.flatten(), dim=0).item()
            print(f"{sub} M={m} N={n} K={k}: first call {time.time() - t0:.1f}s cos {cos:.5f}", flush=True)
            bad += cos < 0.999
        except Exception as e:
            print(f"{sub} M={m} N={n} K={k}: FAILED after {time.time() - t0:.1f}s: {type(e).__name__}: {str(e)[:300]}", flush=True)
            break
sys.exit(1 if bad else 0)
