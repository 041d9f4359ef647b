#!/usr/bin/env python3
"""What a kernel launched like the fp8 skinny GEMM can reach at the fp8 bench's shapes (one GPU,
H200): the fp8 GEMM's ratio to the HBM floor read against two kernels in the same run.

  idle        executors.cute.bound's idle kernel: one warp that waits for the previous kernel
              (PDL), reads x's first word and writes it; the period of a dependent launch with
              no work. No kernel that reads x is faster. idle_nopdl: launched without PDL.
  stream      the best of bound.stream_configs: the weight's N*K bytes read with 16-byte
              loads, part of them issued before the PDL wait, x read after it, per-warp XORs
              written; the GEMM's bytes, launch and dependency without its arithmetic.
              stream_nopdl: its first geometry launched without PDL. With --rows 1,8 also
              stream_r8, the best of the same geometries reading in the GEMM lanes' pattern
              (8 rows x 64 bytes per warp load).
  fp8         executors.cute.fp8.gemm_fp8 at its shipped config, block scales, M = 1, 8, 16
  floor       (weight bytes + scale bytes at M = 1) / read bandwidth (torch.sum over 2 GiB),
              as in bench_fp8_gemm

Each kernel is checked before it is timed, on fresh random inputs with poisoned outputs: idle's
word is x's; stream's per-warp words XOR to the XOR of the weight's words (torch) and its last
word is x's; the GEMM against the fp32 reference of the dequantized operands. Timing as in
bench_fp8_gemm: each path captured in a CUDA graph of --iters calls rotating over 4 weight sets,
replayed --trials times in alternating order, median per call (CUDA events).

Usage: python scripts/bench_launch_bound.py --out /tmp/launch_bound/launch_bound.md [--shapes q_b,qkv_a]
       python scripts/bench_launch_bound.py --precompile     (CPU, no GPU: the disk cache)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

import torch
from bench_fp8_gemm import (
    NSETS,
    SHAPES,
    TARGET_FLOOR,
    Acts,
    Weights,
    _compile_worker,
    read_bandwidth,
    rel_err,
    start_report,
    time_graphs,
)

import executors.cute as ec
from executors.cute import bound, fp8

MS = (1, 8, 16)
POISON = 0x5A5A5A5A


def xor_words(t: torch.Tensor) -> int:
    """XOR of all 32-bit words of a contiguous tensor (on its device)."""
    v = t.contiguous().view(torch.int32).flatten()
    while v.numel() > 1:
        if v.numel() % 2:
            v = torch.cat([v, v.new_zeros(1)])
        h = v.numel() // 2
        v = v[:h] ^ v[h:]
    return int(v[0]) if v.numel() else 0


def first_word(x_u8: torch.Tensor) -> int:
    return int(x_u8.reshape(-1)[:4].contiguous().view(torch.int32)[0])


def check_bound(fn, cfg, x_u8, w_u8) -> str | None:
    """None if the kernel's output is right, else what is wrong."""
    out = torch.full((bound.out_words(cfg),), POISON, device="cuda", dtype=torch.int32)
    fn(x_u8, w_u8, out)
    torch.cuda.synchronize()
    if int(out[-1]) != first_word(x_u8):
        return f"x word {int(out[-1]):#x} != {first_word(x_u8):#x}"
    if cfg is not None and xor_words(out[:-1]) != xor_words(w_u8):
        return f"weight XOR {xor_words(out[:-1]):#x} != {xor_words(w_u8):#x}"
    return None


def bench_shape(name, n, k, args, bw, log, rows):
    wt = Weights(n, k, bf16=False)
    w_u8 = [w.view(torch.uint8) for w in wt.w]
    acts = {m: Acts(m, k) for m in MS}
    x_u8 = acts[16].x.view(torch.uint8)
    fns, bad = {}, []

    def add_bound(label, cfg, pdl=True):
        fn = bound.get_kernel(cfg, n, k, pdl)
        for a in acts.values():  # fresh inputs per check
            a.refresh()
        why = check_bound(fn, cfg, x_u8, w_u8[0])
        if why is not None:
            bad.append(f"{label}: {why}")
            return
        out = torch.empty(bound.out_words(cfg), device="cuda", dtype=torch.int32)
        fns[label] = lambda i: fn(x_u8, w_u8[i % NSETS], out)

    add_bound("idle", None, True)
    add_bound("idle_nopdl", None, False)
    cands = bound.stream_configs(n, k, args.rows)
    for c in cands:
        add_bound(f"stream:{c.key()}", c)
    for m in MS:
        a = acts[m]
        o = [torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(NSETS)]
        a.refresh()
        fp8.gemm_fp8(a.x, wt.w[0], a.sa_blk, wt.sb_blk[0], o[0])
        err = rel_err(o[0], fp8.dequant_reference(a.x, wt.w[0], a.sa_blk, wt.sb_blk[0]))
        if not err < 1e-2:
            bad.append(f"fp8 M={m}: rel err {err:.3g}")
            continue
        fns[f"fp8_m{m}"] = lambda i, a=a, o=o: fp8.gemm_fp8(a.x, wt.w[i % NSETS], a.sa_blk,
                                                           wt.sb_blk[i % NSETS], o[i % NSETS])
    for b in bad:
        log(f"    {name}: FAILED check, not timed: {b}")
    t = time_graphs(fns, args.iters, args.trials)
    floor = wt.bytes_fp8(1) / bw * 1e6
    streams = {lb: v for lb, v in t.items() if lb.startswith("stream:") and lb.endswith("_d1")}
    best = min(streams, key=streams.get) if streams else None
    r8 = {lb: v for lb, v in t.items() if lb.startswith("stream:") and lb.endswith("_d1_r8")}
    best8 = min(r8, key=r8.get) if r8 else None
    nopdl = next((v for lb, v in t.items() if lb.startswith("stream:") and lb.endswith("_d0")), None)
    row = {"shape": name, "N": n, "K": k, "floor_us": floor, "times_us": t,
           "stream_best": best.split(":", 1)[1] if best else None,
           "stream_us": streams.get(best), "stream_nopdl_us": nopdl,
           "stream_r8_best": best8.split(":", 1)[1] if best8 else None, "stream_r8_us": r8.get(best8),
           "idle_us": t.get("idle"), "idle_nopdl_us": t.get("idle_nopdl"),
           "fp8_us": {m: t.get(f"fp8_m{m}") for m in MS},
           "fp8_config": {m: fp8.default_fp8_config(m, n, k).key() for m in MS}}
    rows.append(row)

    def r(v, d=floor):
        return f"{v / d:.2f}" if v and d else "-"

    f8 = row["fp8_us"]
    st = row["stream_us"]
    log(f"| {name} | {n}x{k} | {floor:.2f} | {fmt(row['idle_us'])} ({r(row['idle_us'])}) | "
        f"{fmt(row['idle_nopdl_us'])} | {fmt(st)} ({r(st)}) | {fmt(nopdl)} | "
        + " / ".join(fmt(f8[m]) for m in MS) + " | " + " / ".join(r(f8[m]) for m in MS) + " | "
        + " / ".join(r(f8[m], st) for m in MS) + f" | {row['stream_best']} | "
        + f"{fmt(row['stream_r8_us'])} ({r(row['stream_r8_us'])}; {r(row['stream_r8_us'], st)} of stream) |")


def fmt(v) -> str:
    return f"{v:.2f}" if v else "-"


def precompile(shapes, jobs: int, log, rows=(1,)):
    """The run's kernels for sm_90a into the disk cache: the bound kernels here, the GEMM's
    shipped configs in `jobs` processes (bench_fp8_gemm's worker)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    gemms = sorted({("fp8", fp8.default_fp8_config(m, n, k).to_json(), n, k, "block", "block", "bfloat16")
                    for n, k in shapes.values() for m in MS})
    with ProcessPoolExecutor(max(jobs, 1), mp_context=mp.get_context("spawn")) as ex:
        pending = ex.map(_compile_worker, [(kd, json.loads(c), n, k, ka, kb, o) for kd, c, n, k, ka, kb, o in gemms])
        todo = [(None, 128, 128, pdl) for pdl in (True, False)]
        for n, k in shapes.values():
            todo += [(c, n, k, True) for c in bound.stream_configs(n, k, rows)]
        for i, (c, n, k, pdl) in enumerate(todo):
            bound.get_kernel(c, n, k, pdl, arch="sm_90a")
            if i % 50 == 0:
                log(f"  bound kernels: {i + 1}/{len(todo)}")
        errs = [e for e in pending if e]
    log(f"compiled {len(todo)} bound kernels and {len(gemms)} GEMMs for sm_90a into {ec.cache_dir()}"
        + (f"; {len(errs)} GEMMs failed, first: {errs[0]}" if errs else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/launch_bound/launch_bound.md")
    ap.add_argument("--precompile", action="store_true", help="only compile the bound kernels for sm_90a (no GPU)")
    ap.add_argument("--shapes", default="", help="comma-separated names (default: all of bench_fp8_gemm's)")
    ap.add_argument("--jobs", type=int, default=2, help="processes for --precompile's GEMMs")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--rows", default="1", help="stream load patterns: 1 (contiguous), 8 (the GEMM lanes'), or 1,8")
    args = ap.parse_args()
    try:
        args.rows = tuple(int(r) for r in args.rows.split(","))
    except ValueError:
        args.rows = ()
    if not args.rows or any(r not in (1, 8) for r in args.rows):
        print("bench_launch_bound: --rows takes 1, 8 or 1,8", file=sys.stderr)
        return 2
    want = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in want if not any(s in (nm, nm.split("_", 1)[1]) for nm in SHAPES)]
    if unknown:
        print(f"bench_launch_bound: unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}",
              file=sys.stderr)
        return 2
    shapes = {nm: v for nm, v in SHAPES.items() if not want or nm in want or nm.split("_", 1)[1] in want}
    if args.precompile:
        precompile(shapes, args.jobs, print, args.rows)
        return 0
    out = Path(args.out)
    log, props = start_report(out, "launch bounds of the fp8 GEMM's shapes")
    if props is None:
        return 1
    bw = read_bandwidth()
    log(f"read bandwidth (torch.sum over 2 GiB bf16): {bw / 1e12:.3f} TB/s")
    log(f"CUDA-graph replay, {args.iters} calls per graph over {NSETS} rotated weight sets, median of "
        f"{args.trials} trials; us per call; (x) = ratio to the floor. Target of the GEMM: <= {TARGET_FLOOR}x floor.")
    log("")
    log("| shape | NxK | floor us | idle us | idle no PDL | stream us | stream no PDL | fp8 us M=1/8/16 | "
        "fp8/floor | fp8/stream | best stream config | stream r8 us (x floor; x stream) |")
    log("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    rows = []
    for name, (n, k) in shapes.items():
        try:
            bench_shape(name, n, k, args, bw, log, rows)
            torch.cuda.empty_cache()
        except Exception as e:
            log(f"| {name} | FAILED: {type(e).__name__}: {str(e).splitlines()[0][:300]} |")
            traceback.print_exc()
            break
    res = {"device": props.name, "bandwidth_Bps": bw, "args": vars(args), "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    log(f"\nnumbers: {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
