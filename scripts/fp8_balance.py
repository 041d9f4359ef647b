#!/usr/bin/env python3
"""How evenly the fp8 GEMM's default grid spreads weight bytes over the SMs, beside the measured
time over the floor of a `bench_fp8_gemm.py` record (no GPU: registers come from the compiled
cubin, residency from registers, threads and shared memory).

    CUTE_DSL_ARCH=sm_90a python scripts/fp8_balance.py results/data/fp8_gemm/<record>_fp8_gemm.json

Per (shape, M bucket): blocks, blocks one SM holds, waves, and the busiest SM's weight bytes over
the mean (blocks dealt out round-robin, all of a wave at once), next to the record's median
fp8_blk / floor over that bucket's M.
"""

from __future__ import annotations

import json
import statistics
import sys

from executors.cute import _lock, cubin_of, cubin_regcount, fp8, fp8_kernels
from executors.cute.fp8_config import BLOCK, SMS, blocks_per_sm


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


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    rec = json.loads(open(sys.argv[1]).read())
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
