#!/usr/bin/env python3
"""Kimi-K3 KDA decode projections at TP8 on one GPU: before, after, compiled plan, floor.

Paths per M (decode tokens), us per layer step:
  seq        before: one packed torch.mm [M,7168]x[7168,6288], split, F_B torch.mm (one stream)
  two_torch  after, as vLLM PR #54697 wrote it: QKVG on the current stream, F_A/beta then
             F_B on an aux stream, fork/join with events, torch.mm everywhere
  compiled   plans/k3_kda_projection.yaml compiled and built with build_executor, the tuning
             file's limits (gate) and backends/configs (executors.tools.tune.apply_tuning); the gate
             sees `capturing` so it picks its variant as inside GraphedExecutor
  forced_*   the compiled plan with the region forced to each variant (information)
  kernel     executors.cute.kda_fused_step called directly on preallocated outputs (information:
             what the compiled plan adds on top of its kernel launches)
  floor      weight bytes (6288x7168 + 1536x128, bf16) / HBM read bandwidth measured here
Correctness first per M: fresh random x, the compiled plan eagerly and through
GraphedExecutor with NaN-poisoned static outputs, and both hand paths, against fp32
references (cosine > 0.999, rel < 1e-2; g1's reference uses the bf16-rounded f_a).
Timing: one CUDA graph of --iters steps per path, 4 weight sets rotated (the L2 is 60 MB),
2 warm-ups, median of --trials (21) replays, the paths in a new random order every trial.

    python scripts/bench_kda_step.py --tuning results/tuning/X.json --out /tmp/kda_step
    python scripts/bench_kda_step.py --dry-run     # CPU, small shapes, no graphs
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from executors.tools.bench import (
    close_report,
    env_info,
    log,
    parse_tokens,
    write_report,
)
from executors.tools.timing import eager_times, hbm_bandwidth, time_graphs
from executors.tools.tune import ForcedGate, load_tuning, tuned_executor
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan

ROOT = Path(__file__).resolve().parent.parent

KDA = ROOT / "plans" / "k3_kda_projection.yaml"
NSETS = 4
REGION = "kda_projection.0"


class Shapes:
    def __init__(self, plan):
        p = plan.params
        self.H, self.hc, self.fa, self.lh, self.pad = p["hidden"], p["head_cols"], p["fa_rank"], p["local_heads"], p["fab_pad"]
        self.NQ = 4 * self.hc
        self.NP = self.NQ + self.fa + self.lh + self.pad
        self.weight_bytes = (self.NP * self.H + self.hc * self.fa) * 2


class Problem:
    """x, 4 weight sets, output buffers per set, the seed PRs' two hand-written paths."""

    def __init__(self, m, s: Shapes, dev, gen):
        self.m, self.s, self.dev = m, s, dev
        r = lambda *sh, scale=1.0: (torch.randn(*sh, generator=gen) * scale).to(torch.bfloat16).to(dev)  # noqa: E731
        self.x = r(m, s.H)
        self.wp = [r(s.NP, s.H, scale=s.H ** -0.5) for _ in range(NSETS)]
        self.wfb = [r(s.hc, s.fa, scale=s.fa ** -0.5) for _ in range(NSETS)]
        z = lambda n: [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(NSETS)]  # noqa: E731
        self.y, self.q, self.fab, self.g1 = z(s.NP), z(s.NQ), z(s.NP - s.NQ), z(s.hc)
        self.cuda = dev.type == "cuda"
        if self.cuda:
            self.aux = torch.cuda.Stream()
            self.ev = [(torch.cuda.Event(), torch.cuda.Event()) for _ in range(64)]
        self.k = 0

    def seq(self, i):
        j, s = i % NSETS, self.s
        torch.mm(self.x, self.wp[j].t(), out=self.y[j])
        torch.mm(self.y[j][:, s.NQ:s.NQ + s.fa], self.wfb[j].t(), out=self.g1[j])
        return self._split_seq(j)

    def _split_seq(self, j):
        s, y = self.s, self.y[j]
        return {"mixed_qkv": y[:, :3 * s.hc], "g_proj": y[:, 3 * s.hc:s.NQ], "g1": self.g1[j],
                "beta": y[:, s.NQ + s.fa:s.NQ + s.fa + s.lh]}

    def two_torch(self, i):
        j, s = i % NSETS, self.s

        def aux():
            torch.mm(self.x, self.wp[j][s.NQ:].t(), out=self.fab[j])
            torch.mm(self.fab[j][:, :s.fa], self.wfb[j].t(), out=self.g1[j])

        if self.cuda:
            cur = torch.cuda.current_stream()
            e0, e1 = self.ev[self.k % len(self.ev)]
            self.k += 1
            e0.record(cur)
            self.aux.wait_event(e0)
            with torch.cuda.stream(self.aux):
                aux()
                e1.record(self.aux)
            torch.mm(self.x, self.wp[j][:s.NQ].t(), out=self.q[j])
            cur.wait_event(e1)
        else:
            aux()
            torch.mm(self.x, self.wp[j][:s.NQ].t(), out=self.q[j])
        q = self.q[j]
        return {"mixed_qkv": q[:, :3 * s.hc], "g_proj": q[:, 3 * s.hc:], "g1": self.g1[j],
                "beta": self.fab[j][:, s.fa:s.fa + s.lh]}

    def reference(self, j=0):
        s = self.s
        full = self.x.float() @ self.wp[j].float().t()
        fa = full[:, s.NQ:s.NQ + s.fa].to(torch.bfloat16).float()
        return {"mixed_qkv": full[:, :3 * s.hc], "g_proj": full[:, 3 * s.hc:s.NQ],
                "g1": fa @ self.wfb[j].float().t(), "beta": full[:, s.NQ + s.fa:s.NQ + s.fa + s.lh]}

    def poison(self):
        for bufs in (self.y, self.q, self.fab, self.g1):
            for b in bufs:
                b.fill_(float("nan"))


COLS = [("M", "M", ""), ("seq_us", "before: seq torch", ".2f"), ("two_torch_us", "after: 2-stream torch", ".2f"),
        ("compiled_us", "compiled", ".2f"), ("variant", "variant", ""), ("floor_us", "floor", ".2f"),
        ("compiled_over_floor", "comp/floor", ".3f"), ("seq_over_compiled", "seq/comp (>=1.25)", ".3f"),
        ("two_over_compiled", "2s/comp (>=1.0)", ".3f"), ("forced_two_branch_us", "forced two_branch", ".2f"),
        ("forced_packed_us", "forced packed", ".2f"), ("kernel_us", "kernel alone", ".2f"), ("ok", "check", "")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tuning", help="tuning file from `planner tune` (limits + backends)")
    ap.add_argument("--ms", default="1..16")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--trials", type=int, default=21)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--stem", default="kda_step")
    ap.add_argument("--dry-run", action="store_true", help="CPU, small shapes, eager timing")
    a = ap.parse_args()
    cpu = a.dry_run
    if not cpu and not torch.cuda.is_available():
        print("bench_kda_step: needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    dev = torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())
    ov = {"hidden": 64, "kda_heads": 8, "head_dim": 4, "fa_rank": 8} if cpu else {}
    load = lambda: load_plan(KDA, dict(ov))  # noqa: E731
    shp = Shapes(load())
    tuning = load_tuning(a.tuning) if a.tuning else None
    if tuning is None:
        log("[kda] no --tuning: the compiled plan runs with the plan's default limit and default backends")
    info = env_info()
    t0 = time.time()
    # read bandwidth measured before and after the timings; the floor uses the higher one
    # (a 2 GiB sum varied by 4% between runs minutes apart on one H200, run18)
    bw = {"sum_read_TBps": None} if cpu else hbm_bandwidth()
    if not cpu:
        log(f"[kda] HBM: sum read {bw['sum_read_TBps']:.3f} TB/s, copy {bw['copy_rw_TBps']:.3f} TB/s (r+w)")
    gen = torch.Generator().manual_seed(0)
    cute_step = None
    if not cpu:
        from executors import cute
        cute_step = cute.kda_fused_step if cute.available() else None
    rows = []
    backends = None
    for m in parse_tokens(a.ms, []):
        p = Problem(m, shp, dev, gen)
        exs = [tuned_executor(compile_plan(load()), {"w_packed": p.wp[j], "w_fb": p.wfb[j]}, tuning, device=dev)
               for j in range(NSETS)]
        backends = backends or dict(exs[0].backends)
        limit = exs[0].tuned.get("kda_two_branch_max")
        # ---- correctness (fresh x; poisoned outputs)
        p.x.copy_(torch.randn(m, shp.H, generator=gen).to(torch.bfloat16))
        want = p.reference(0)
        checks = {}
        p.poison()
        checks["seq"] = close_report(p.seq(0), want)
        p.poison()
        checks["two_torch"] = close_report(p.two_torch(0), want)
        checks["compiled_eager"] = close_report(exs[0](x=p.x), want)
        variant = None
        if not cpu:
            from executors.cudagraph import GraphedExecutor
            ge = GraphedExecutor(exs[0], buckets=[m])
            _, _, static_out, _ = ge.capture({"num_tokens": m})
            for v in static_out.values():
                v.fill_(float("nan"))
            checks["compiled_graphed"] = close_report(ge(x=p.x), want)
            variant = ge.last_variants.get(REGION)
        else:
            f = exs[0].facts({"x": p.x}, capturing=True)
            exs[0](x=p.x, _facts=f)
            variant = exs[0].last_variants.get(REGION)
        for nm in ("two_branch", "packed"):
            exf = tuned_executor(compile_plan(load()), {"w_packed": p.wp[0], "w_fb": p.wfb[0]}, tuning, device=dev)
            exf._gates[REGION] = ForcedGate(REGION, nm, ["two_branch", "packed"])
            checks[f"forced_{nm}"] = close_report(exf(x=p.x), want)
        ok = all(c[0] for c in checks.values())
        if not ok:
            log(f"[kda] M={m}: CHECK FAILED {json.dumps({k: c for k, c in checks.items()})}")

        # ---- timing
        def forced(nm, exs=exs, p=p):
            def f(i):
                ex = exs[i % NSETS]
                saved = ex._gates[REGION]
                ex._gates[REGION] = ForcedGate(REGION, nm, ["two_branch", "packed"])
                try:
                    return ex(x=p.x)
                finally:
                    ex._gates[REGION] = saved
            return f

        fns = {"seq": p.seq, "two_torch": p.two_torch, "compiled": lambda i, exs=exs, p=p: exs[i % NSETS](x=p.x),
               "forced_two_branch": forced("two_branch"), "forced_packed": forced("packed")}
        if not cpu and cute_step is not None:
            def kernel(i, p=p):
                j = i % NSETS
                return cute_step(p.x, p.wp[j], p.wfb[j], p.y[j], p.g1[j], fa_col=shp.NQ)
            fns["kernel"] = kernel
        t = eager_times(fns, a.iters, a.trials) if cpu else time_graphs(fns, iters=a.iters, trials=a.trials, nsets=NSETS)
        row = {"M": m, **{f"{k}_us": round(v, 2) for k, v in t.items()}, "variant": variant, "limit": limit,
               "seq_over_compiled": round(t["seq"] / t["compiled"], 3),
               "two_over_compiled": round(t["two_torch"] / t["compiled"], 3),
               "ok": ok, "checks": {k: c[1] for k, c in checks.items()}}
        rows.append(row)
        log(f"[kda] M={m:2d}: seq {t['seq']:.2f}  2s-torch {t['two_torch']:.2f}  compiled {t['compiled']:.2f} ({variant})"
            f"  forced 2b {t['forced_two_branch']:.2f} / packed {t['forced_packed']:.2f} us"
            + (f"  kernel {t['kernel']:.2f}" if "kernel" in t else "")
            + f"  check {'ok' if ok else 'FAILED'} [{time.time() - t0:.0f}s]")
        p = exs = None
        if not cpu:
            torch.cuda.empty_cache()
    floor = None
    if not cpu:
        bw_end = hbm_bandwidth()
        bw = {"start": bw, "end": bw_end,
              "sum_read_TBps": max(bw["sum_read_TBps"], bw_end["sum_read_TBps"])}
        floor = shp.weight_bytes / (bw["sum_read_TBps"] * 1e6)
        log(f"[kda] HBM at the end: sum read {bw_end['sum_read_TBps']:.3f} TB/s; floor "
            f"{shp.weight_bytes / 1e6:.2f} MB / {bw['sum_read_TBps']:.3f} TB/s = {floor:.2f} us")
    for row in rows:
        row["floor_us"] = None if floor is None else round(floor, 2)
        row["compiled_over_floor"] = None if floor is None else round(row["compiled_us"] / floor, 3)
    meta = {**info, "hbm": bw, "weight_bytes": shp.weight_bytes, "tuning": a.tuning,
            "limits": (tuning or {}).get("limits"), "backends": backends, "iters": a.iters, "trials": a.trials,
            "weight_sets": NSETS, "seconds": round(time.time() - t0, 1)}
    title = f"KDA decode projections (TP8 shapes), {info.get('device', 'cpu')}, us per layer step (graph replay)"
    notes = ["Targets: compiled <= 1.10x floor (M<=8), <= 1.20x (M<=16), >= 1.25x vs seq, >= 1.0x vs 2-stream torch.",
             "floor = weight bytes / HBM read bandwidth (2 GiB torch.sum, best of three medians of 7, the higher"
             " of a measurement before and one after the timings) in the same run."]
    table = write_report(a.out, a.stem, meta, rows, COLS, title, notes)
    print(table)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
