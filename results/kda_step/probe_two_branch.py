"""Diagnostic (2026-11-30, session 8): why the compiled KDA plan forced to its two-branch variant
takes ~29 us at M = 13..15 but ~26 at 12 and 16 (bench_kda_step's "forced two_branch" column).
Captures 20 forced two-branch steps (4 weight sets) in a CUDA graph at each M, replays it under
torch.profiler and prints the GPU kernels of one replay with their total time, and the executor's
backend choices. Run from the repo root after staging (see ../kda_kernels/run_gpu.sh)."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_kda_step as b  # noqa: E402
import torch  # noqa: E402

from executors.tune import ForcedGate, capture_steps, load_tuning, tuned_executor  # noqa: E402
from planner.pipeline import compile_plan  # noqa: E402

T = os.environ.get("TUNING") or ROOT / "results/tuning/2026-11-30_h200_k3_kda_projection.json"
tuning = load_tuning(str(T))
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
shp = b.Shapes(b.load_plan(b.KDA, {}))
for m in [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "12,13,15,16").split(",")]:
    p = b.Problem(m, shp, dev, gen)
    exs = [tuned_executor(compile_plan(b.load_plan(b.KDA, {})), {"w_packed": p.wp[j], "w_fb": p.wfb[j]}, tuning,
                          device=dev) for j in range(b.NSETS)]
    for ex in exs:
        ex._gates[b.REGION] = ForcedGate(b.REGION, "two_branch", ["two_branch", "packed"])
    g = capture_steps(lambda i, exs=exs, p=p: exs[i % b.NSETS](x=p.x), 20, 2, b.NSETS)
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(7):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1000 / 20)
    print(f"M={m}: forced two_branch {sorted(ts)[3]:.2f} us/step; backends "
          f"{ {k: v for k, v in exs[0].backends.items() if 'two_branch' in k} }")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            r = rows.setdefault(ev.name[:110], [0, 0.0])
            r[0] += 1
            r[1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    for name, (n, tot) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        print(f"   {n:4d} x {tot / n:8.2f} us  {name}")
