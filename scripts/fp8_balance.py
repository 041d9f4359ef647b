#!/usr/bin/env python3
"""How evenly the fp8 GEMM's default grid spreads weight bytes over the SMs, beside the measured
time over the floor of a `bench_fp8_gemm.py` record (no GPU: registers come from the compiled
cubin, residency from registers, threads and shared memory).

    CUTE_DSL_ARCH=sm_90a python scripts/fp8_balance.py results/data/fp8_gemm/<record>_fp8_gemm.json

Per (shape, M bucket): blocks, blocks one SM holds, waves, and the busiest SM's weight bytes over
the mean (blocks dealt out round-robin, all of a wave at once), next to the record's median
fp8_blk / floor over that bucket's M.

    CUTE_DSL_ARCH=sm_90a python scripts/fp8_balance.py --sweep RECORD.json [--top 8]

The same for a sweep record's candidates, fastest first per (shape, M bucket), with whether an SM
still has room for the next kernel's blocks beside this grid's (what the L2 prefetch before the
PDL wait, l2pre, needs to overlap the two).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from executors.cute import _lock, cubin_of, cubin_regcount, fp8, fp8_kernels
from executors.cute.fp8_config import BLOCK, SMS, blocks_per_sm, resident_per_sm


def balance(cfg, n: int, k: int) -> dict:
    with _lock:
        cub = cubin_of(lambda opts: fp8_kernels.compile_tvm_ffi(cfg, n, k, 2, 2, 0, extra_options=opts), "sm_90a")
    regs = cubin_regcount(cub)
    per_sm = blocks_per_sm(cfg, regs)
    blocks = cfg.grid(n)
    wave = SMS * per_sm
    # round-robin over SMs, one wave at a time: the busiest SM's blocks over the mean
    full, rest = divmod(blocks, wave)
    busiest = full * per_sm + min(per_sm, -(-rest // SMS)) if rest else full * per_sm
    return {"regs": regs, "per_sm": per_sm, "blocks": blocks, "waves": blocks / wave,
            "busiest_over_mean": busiest / (blocks / SMS)}


def room_for_next(cfg, n: int, b: dict) -> bool:
    """An SM holds this grid's share of blocks and as many of the next kernel's besides."""
    return b["per_sm"] >= 2 * resident_per_sm(cfg, n, SMS, b["regs"])


def sweep_report(rec: dict, top: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_fp8_gemm import SHAPES, candidates

    mode, kinds = rec["args"]["sweep"], rec["args"].get("sweep_kinds", "block")
    print(f"sweep {mode} on {rec['device']}, read bandwidth {rec['bandwidth_Bps'] / 1e12:.3f} TB/s")
    print("| shape | M bucket | config | us | vs default | regs | blocks / SM | room for the next grid |")
    print("|---|---:|---|---:|---:|---:|---:|---|")
    for name, buckets in rec["sweep"].items():
        n, k = SHAPES[name]
        for bucket, res in buckets.items():
            # records since the L2-prefetch sweep list their configs; older ones are rebuilt from
            # today's candidate lists, which may no longer hold every key they timed
            by_key = ({key: fp8.Fp8Config.from_dict(d) for key, d in res["configs"].items()} if "configs" in res
                      else {c.key(): c for c in candidates(mode, int(bucket), n, k, kinds)})
            times = sorted((t, key) for key, t in res.get("all_us", {}).items() if t)
            missing = [key for _, key in times[:top] if key not in by_key]
            if missing:
                print(f"{name} M<={bucket}: {len(missing)} timed configs not in today's candidates, left out")
            base = res.get("default_us")
            for t, key in [(t, key) for t, key in times[:top] if key in by_key]:
                cfg = by_key[key]
                b = balance(cfg, n, k)
                vs = f"{t / base:.3f}" if base else "-"
                print(f"| {name} | {bucket} | {key} | {t:.2f} | {vs} | {b['regs']} "
                      f"| {b['per_sm']} | {'yes' if room_for_next(cfg, n, b) else 'no'} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("record")
    ap.add_argument("--sweep", action="store_true", help="report the record's sweep candidates")
    ap.add_argument("--top", type=int, default=8, help="candidates per (shape, M bucket) with --sweep")
    args = ap.parse_args()
    rec = json.loads(open(args.record).read())
    if args.sweep:
        sweep_report(rec, args.top)
        return 0
    by = {}
    for r in rec["rows"]:
        if r.get("blk_over_floor") is None:
            continue
        by.setdefault((r["shape"], r["N"], r["K"], 8 if r["M"] <= 8 else 16), []).append(r["blk_over_floor"])
    print("| shape | M bucket | config | regs | blocks / SM | blocks | waves | busiest SM / mean | fp8_blk / floor (median) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for (name, n, k, mt), ratios in sorted(by.items()):
        if k % BLOCK:
            continue
        cfg = fp8.default_fp8_config(mt, n, k)
        b = balance(cfg, n, k)
        print(f"| {name} | {mt} | {cfg.key()} | {b['regs']} | {b['per_sm']} | {b['blocks']} | {b['waves']:.2f} "
              f"| {b['busiest_over_mean']:.3f} | {statistics.median(ratios):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
