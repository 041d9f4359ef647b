#!/usr/bin/env python3
"""Per-block timeline of the fp8 decode GEMM in CUDA-graph replay (diagnostics, sm_90 GPU).

Per shape, M and config variant (the shipped config; without PDL; with the next kernel launched
at the start or after the wait, the other way round from the shipped one; with the L2 prefetch of
every iteration and the early launch), a CUDA graph of 20 calls over 4 rotated weight sets is
captured as bench_fp8_gemm.py times it, each call stamping into its own buffer
(Fp8Config.timeline: every block's %globaltimer at its start, when its pre-wait weights are
issued, past the PDL wait, at its end, and its SM id). The output is checked against the fp32
reference first. Over the steady calls 6..15 (medians), relative to call i:

  period    first block start of call i+1 - that of call i (= time per GEMM)
  lead      last block end of call i - first block start of call i+1 (> 0: the next call's
            blocks were resident before this one finished)
  resident  blocks of call i+1 that started before call i's last block ended
  release   first PDL-wait return of call i+1 - last block end of call i
  body      last block end - last PDL-wait return (the work after the wait)
  tail      last block end - first block end (how unevenly the blocks finish)
  wait      last PDL-wait return - first block start (first blocks: from resident to released)

Usage: python scripts/fp8_timeline.py [--shapes dsv3_qkv_a,dsv3_o_proj] [--ms 8] [--out FILE.json]
           [--config '{"shape": "dsv3_qkv_a", "M": 8, "warps_k": 7, "unroll": 2, ...}' ...]
       python scripts/fp8_timeline.py --precompile [--shapes ...] [--ms ...] [--config ...]   (CPU)
--config adds a case (Fp8Config fields besides shape and M; repeatable); with --config and no
--shapes only those cases run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from executors.cute import fp8

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fp8_gemm import SHAPES  # noqa: E402  (scripts/ is not a package)

CALLS, NSETS, STEADY = 20, 4, range(6, 16)
DEFAULT_SHAPES = "dsv3_qkv_a,dsv3_q_b,dsv3_kv_b,dsv3_o_proj,dsv3_mlp_gate_up,kda_qkvg"


def variants(m: int, n: int, k: int) -> dict:
    """name -> timeline config."""
    base = fp8.default_fp8_config(m, n, k)
    out = {"shipped": base, "no_pdl": dataclasses.replace(base, pdl=False, early=False),
           "early" if not base.early else "late": dataclasses.replace(base, early=not base.early)}
    nit = base.iterations(k)
    if nit > base.loaded_first(k):
        out["l2pre_all_early"] = dataclasses.replace(base, l2pre=nit, early=True)
    seen, kept = set(), {}
    for name, c in out.items():  # a variant equal to an earlier one is timed once
        if c.check(m, n, k) is None and c not in seen:
            seen.add(c)
            kept[name] = dataclasses.replace(c, timeline=True)
    return kept


def summarize(stamps) -> dict:
    """stamps: [calls, blocks, 8] int64 ns (slots 0 start, 1 issued, 2 past the wait, 3 end, 7 SM)."""
    s = stamps.double()
    start, waited, end = s[..., 0], s[..., 2], s[..., 3]
    rows = []
    for i in STEADY:
        nxt = i + 1
        rows.append({
            "period": (start[nxt].min() - start[i].min()).item(),
            "lead": (end[i].max() - start[nxt].min()).item(),
            "resident": int((start[nxt] < end[i].max()).sum().item()),
            "release": (waited[nxt].min() - end[i].max()).item(),
            "body": (end[i].max() - waited[i].max()).item(),
            "tail": (end[i].max() - end[i].min()).item(),
            "wait": (waited[i].max() - start[i].min()).item(),
        })
    return {key: statistics.median(r[key] for r in rows) / (1 if key == "resident" else 1e3) for key in rows[0]}


def run_case(name: str, n: int, k: int, m: int, cfg, log) -> dict:
    import torch

    e4m3, dev = torch.float8_e4m3fn, "cuda"
    ws = [(torch.randn(n, k, device=dev) * 2).to(e4m3) for _ in range(NSETS)]
    sbs = [torch.rand(-(-n // 128), k // 128, device=dev) * 0.01 + 0.002 for _ in range(NSETS)]
    x = (torch.randn(m, k, device=dev) * 2).to(e4m3)
    sa = torch.rand(m, k // 128, device=dev) * 0.01 + 0.002
    outs = [torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16) for _ in range(NSETS)]
    tl = torch.zeros(CALLS, cfg.grid(n), 8, dtype=torch.int64, device=dev)

    def call(i):
        fp8.gemm_fp8(x, ws[i % NSETS], sa, sbs[i % NSETS], outs[i % NSETS], config=cfg, timeline=tl[i].view(-1))

    for i in range(NSETS):
        call(i)
    torch.cuda.synchronize()
    refs = [fp8.dequant_reference(x, ws[i], sa, sbs[i]) for i in range(NSETS)]
    err = max(((outs[i].float() - refs[i]).abs().max() / refs[i].abs().max()).item() for i in range(NSETS))
    if not err < 1e-2:
        raise RuntimeError(f"{name} {cfg.key()}: wrong output, rel err {err:.2e}")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        for i in range(CALLS):
            call(i)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / CALLS)
    row = {"shape": name, "N": n, "K": k, "M": m, "config": cfg.key(), "rel_err": err,
           "us_per_call": statistics.median(times), **summarize(tl.cpu())}
    log(" ".join(f"{key}={v:.3f}" if isinstance(v, float) else f"{key}={v}" for key, v in row.items()))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=None, help=f"default {DEFAULT_SHAPES} (none with --config)")
    ap.add_argument("--config", action="append", default=[], help="an extra case as JSON (see above)")
    ap.add_argument("--ms", default="8")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--precompile", action="store_true", help="compile the kernels (no GPU) and stop")
    args = ap.parse_args()
    cases = []
    for text in args.config:
        try:
            d = json.loads(text)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            name, m = d.pop("shape"), int(d.pop("M"))
            n, k = SHAPES[name]
            cfg = dataclasses.replace(fp8.Fp8Config.from_dict(d), timeline=True)
        except (ValueError, KeyError, TypeError) as e:
            print(f"--config {text!r}: {e}", file=sys.stderr)
            return 2
        why = cfg.check(m, n, k)
        if why is not None:
            print(f"--config {text!r}: {why}", file=sys.stderr)
            return 2
        cases.append((name, n, k, m, "config", cfg))
    shapes = args.shapes or ("" if args.config else DEFAULT_SHAPES)
    for name in filter(None, shapes.split(",")):
        if name not in SHAPES:
            print(f"unknown shape {name!r}; known: {', '.join(SHAPES)}", file=sys.stderr)
            return 2
        n, k = SHAPES[name]
        for m in (int(v) for v in args.ms.split(",")):
            cases += [(name, n, k, m, vname, cfg) for vname, cfg in variants(m, n, k).items()]
    if args.precompile:
        for _name, n, k, _m, _v, cfg in cases:
            fp8.get_fp8_kernel(cfg, n, k, "block", "block", arch="sm_90a")
        print(f"precompiled {len(cases)} timeline kernels")
        return 0
    rows = []
    for name, n, k, m, vname, cfg in cases:
        try:
            rows.append({"variant": vname, **run_case(name, n, k, m, cfg, print)})
        except Exception as e:  # one failing case does not stop the others
            print(f"{name} M={m} {vname}: FAILED {type(e).__name__}: {str(e)[:300]}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
