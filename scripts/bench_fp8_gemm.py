#!/usr/bin/env python3
"""fp8 e4m3 decode GEMMs on one GPU (H200): correctness, then timing against the HBM floor,
torch's scaled matmul and the bf16 CuTe kernel, at the DeepSeek-V3 TP8 decode shapes and the KDA
shapes with fp8 weights, M = 1..16.

Per shape and M, every path is first run on fresh random inputs with NaN-poisoned outputs and
compared with an fp32 reference of the dequantized operands (fp8.dequant_reference); a path that
fails is reported and not timed, and one failing shape does not stop the others. Then each path
is captured in a CUDA graph of --iters calls that rotate over 4 weight sets (so L2 does not hold
the weights), replayed --trials times in alternating order, median per call (CUDA events).

Paths (out = bf16):
  fp8_blk        executors.cute.fp8.gemm_fp8, 1x128 activation / 128x128 weight scales (PDL on)
  fp8_blk_nopdl  the same kernel launched without programmatic dependent launch
  fp8_row        per-token / per-output-column scales;  fp8_ten: per-tensor scales
  torch_blk      torch._scaled_mm with the same block scales (cuBLASLt, sm_90 + CUDA >= 12.9);
                 retried with M padded to a multiple of 4 if cuBLASLt refuses the shape
  torch_row      torch._scaled_mm rowwise (best of use_fast_accum False / True)
  torch_ten      torch._scaled_mm tensorwise (best of use_fast_accum False / True)
  bf16_cute      executors.cute.skinny_gemm on the dequantized bf16 operands (twice the bytes)
  floor          (weight bytes + scale bytes) / read bandwidth, measured in this run (torch.sum
                 over 2 GiB, a read-only kernel)

Usage: python scripts/bench_fp8_gemm.py --out /tmp/fp8_gemm/fp8_gemm.md [--ms 1,2,4]
       [--shapes qkv_a,qkvg] [--sweep [near|grid|bulk|ahead|bulk-ahead|pre|hold|wg|wgr]] [--jobs 8] [--iters 20] [--trials 7]
       python scripts/bench_fp8_gemm.py --precompile [--sweep [near|grid|bulk|ahead|bulk-ahead|pre|hold|wg|wgr]] [--jobs 2]    (CPU, no GPU)
--sweep first times config candidates at M = 8 and 16 (block scales: fp8.fp8_configs_for's
one-setting neighbours of the default, with `grid` fp8.fp8_config_grid's combinations, with `bulk` fp8.fp8_bulk_grid's bulk-copy rings, with `ahead` fp8.fp8_ahead_grid's activations loaded 1-3 iterations ahead, with `bulk-ahead` the rings with xahead 1-3, with `pre` fp8.fp8_pre_grid's L2 prefetch before the PDL wait, with `hold` fp8.fp8_hold_grid's rings filled before the wait beside the running kernel, with `wg` fp8.fp8_wg_grid's warpgroup wgmma kernels, with `wgr` fp8.fp8_wgr_grid's register-weights warpgroup kernels) and
times the best per M bucket as the fp8_tuned column; --jobs compiles the kernels in that many processes first
(disk cache, $PLANNER_CACHE_DIR); --precompile only does that, for the GPU tests' kernels too
(scripts/gpu/fp8_gemm.sh).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

import executors.cute as ec
from executors.cute import fp8

SHAPES = {  # name: (N, K) per rank
    "dsv3_qkv_a": (2112, 7168),  # fused q_a / kv_a (1536 + 576)
    "dsv3_q_b": (3072, 1536),
    "dsv3_kv_b": (4096, 512),
    "dsv3_o_proj": (7168, 2048),
    "dsv3_mlp_gate_up": (4608, 7168),
    "dsv3_mlp_down": (7168, 2304),
    "dsv3_shared_gate_up": (512, 7168),
    "dsv3_shared_down": (7168, 256),
    "kda_qkvg": (6144, 7168),
    "kda_fa_beta": (144, 7168),
    "kda_fb": (1536, 128),
}
NSETS = 4
BF16 = torch.bfloat16
E4M3 = torch.float8_e4m3fn
TARGET_FLOOR = 1.15
TARGET_TORCH = 1.3


class Report:
    """Prints and appends to the output file as it goes (partial results survive a crash)."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def __call__(self, *parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        with self.path.open("a") as f:
            f.write(line + "\n")


def rel_err(out, ref) -> float:
    o = out.float()
    if not torch.isfinite(o).all():
        return float("inf")
    return ((o - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# --------------------------------------------------------------------------------------
def read_bandwidth():
    big = torch.empty(1 << 30, device="cuda", dtype=BF16).uniform_()
    torch.sum(big, dtype=torch.float32)
    torch.cuda.synchronize()
    ts = []
    for _ in range(9):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        torch.sum(big, dtype=torch.float32)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    bw = big.numel() * 2 / statistics.median(ts)
    del big
    torch.cuda.empty_cache()
    return bw


BW_N, BW_K, BW_M = 8 * 6144, 7168, 8  # 352 MB of fp8 weights, 7x the L2
BW_CFG = fp8.default_fp8_config(BW_M, 6144, BW_K)  # the KDA QKVG kernel's geometry


def kernel_bandwidth():
    """Our kernel's own streaming rate over a 352 MB fp8 weight (KDA QKVG config, 8x the rows)."""
    n, k, m = BW_N, BW_K, BW_M
    w = (torch.randn(n, k, device="cuda") * 2).to(E4M3)
    sb = torch.rand(-(-n // 128), k // 128, device="cuda") * 0.01
    x = (torch.randn(m, k, device="cuda") * 2).to(E4M3)
    sa = torch.rand(m, k // 128, device="cuda") * 0.01
    out = torch.empty(m, n, device="cuda", dtype=BF16)
    fp8.gemm_fp8(x, w, sa, sb, out, config=BW_CFG)
    torch.cuda.synchronize()
    ts = []
    for _ in range(7):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fp8.gemm_fp8(x, w, sa, sb, out, config=BW_CFG)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    rate = (w.numel() + sb.numel() * 4) / statistics.median(ts)
    del w
    torch.cuda.empty_cache()
    return rate


def time_graphs(fns: dict, iters: int, trials: int) -> dict:
    """name -> f(i) (call i of a graph uses weight set i % NSETS). Median us per call."""
    graphs = {}
    for name, f in fns.items():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for i in range(NSETS):
                f(i)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for i in range(iters):
                f(i)
        torch.cuda.synchronize()
        g.replay()
        g.replay()
        graphs[name] = g
    torch.cuda.synchronize()
    times = {n: [] for n in graphs}
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    for t in range(trials):
        for n in (list(graphs) if t % 2 == 0 else list(reversed(graphs))):
            e0.record()
            graphs[n].replay()
            e1.record()
            e1.synchronize()
            times[n].append(e0.elapsed_time(e1) * 1e3 / iters)
    return {n: statistics.median(v) for n, v in times.items()}


# --------------------------------------------------------------------------------------
class Weights:
    """NSETS fp8 weight sets of one shape with their scales of every kind, and bf16 copies."""

    def __init__(self, n: int, k: int, bf16: bool):
        self.n, self.k = n, k
        nb, kb = -(-n // 128), k // 128
        self.w = [(torch.randn(n, k, device="cuda") * 2).to(E4M3) for _ in range(NSETS)]
        self.sb_blk = [torch.rand(nb, kb, device="cuda") * 0.01 + 0.002 for _ in range(NSETS)]
        self.sb_col = [torch.rand(n, 1, device="cuda") * 0.01 + 0.002 for _ in range(NSETS)]
        self.sb_ten = [torch.rand((), device="cuda") * 0.01 + 0.002 for _ in range(NSETS)]
        self.wb = None
        self.torch_blk_wrong = False  # cuBLASLt's blockwise mode computed garbage for this shape
        if bf16:
            self.wb = [(w.float() * fp8._expand_scale(s, "block", n, k, "b")).to(BF16)
                       for w, s in zip(self.w, self.sb_blk, strict=True)]

    def bytes_fp8(self, m: int) -> int:
        return self.n * self.k + 4 * (-(-self.n // 128) * (self.k // 128) + m * (self.k // 128))


class Acts:
    def __init__(self, m: int, k: int):
        kb = k // 128
        self.x = (torch.randn(m, k, device="cuda") * 2).to(E4M3)
        self.sa_blk = torch.rand(m, kb, device="cuda") * 0.01 + 0.002
        self.sa_cm = self.sa_blk.t().contiguous().t()  # cuBLASLt's 1x128 layout (outer-dim-major)
        self.sa_row = torch.rand(m, 1, device="cuda") * 0.01 + 0.002
        self.sa_ten = torch.rand((), device="cuda") * 0.01 + 0.002

    def refresh(self):
        self.x.copy_((torch.randn(self.x.shape, device="cuda") * 2).to(E4M3))
        for s in (self.sa_blk, self.sa_row, self.sa_ten):
            s.copy_(torch.rand_like(s) * 0.01 + 0.002)
        self.sa_cm.copy_(self.sa_blk)


def torch_block_call(a: Acts, wt: Weights, m: int):
    """torch._scaled_mm with the DeepSeek block scales: (timed f(i), checked f(i), label). When
    cuBLASLt refuses M it is retried with x and its scales padded to a multiple of 4 (then 16) rows (the
    timed call reads the padded copies, as if the quantizer wrote them; the checked call
    refreshes them first). Raises with cuBLASLt's reasons if neither runs."""
    def direct(i):
        return torch._scaled_mm(a.x, wt.w[i % NSETS].t(), scale_a=a.sa_cm,
                                scale_b=wt.sb_blk[i % NSETS].t(), out_dtype=BF16)

    try:
        direct(0)
        torch.cuda.synchronize()
        return direct, direct, "torch_blk"
    except Exception as first:
        err = first
    for mp in sorted({-(-m // 4) * 4, -(-m // 16) * 16} - {m}):
        xp = torch.zeros(mp, a.x.shape[1], device="cuda", dtype=E4M3)
        sap = torch.ones(mp, a.sa_blk.shape[1], device="cuda").t().contiguous().t()

        def padded(i, xp=xp, sap=sap):
            return torch._scaled_mm(xp, wt.w[i % NSETS].t(), scale_a=sap,
                                    scale_b=wt.sb_blk[i % NSETS].t(), out_dtype=BF16)[:m]

        def padded_fresh(i, xp=xp, sap=sap, padded=padded):
            xp[:m].copy_(a.x)
            sap[:m].copy_(a.sa_blk)
            return padded(i)

        try:
            padded_fresh(0)
            torch.cuda.synchronize()
            return padded, padded_fresh, f"torch_blk(M->{mp})"
        except Exception as again:
            err = RuntimeError(f"{str(err).splitlines()[0]} / padded to M={mp}: {str(again).splitlines()[0]}")
    raise err


def make_paths(a: Acts, wt: Weights, m: int, outs: dict, log, tuned=None):
    """name -> (f(i), reference fn(i) -> fp32, tolerance, poisoned out tensor or None).
    tuned: the sweep's best config for this M's bucket (an fp8_tuned path when not the default)."""
    n, k = wt.n, wt.k
    paths = {}
    cfg = fp8.default_fp8_config(m, n, k)
    nopdl = dataclasses.replace(cfg, pdl=False)
    o = outs

    def ours(name, sa, sbs, config=None):
        def f(i):
            return fp8.gemm_fp8(a.x, wt.w[i % NSETS], sa, sbs[i % NSETS], o[name][i % NSETS], config=config)

        paths[name] = (f, lambda i: fp8.dequant_reference(a.x, wt.w[i % NSETS], sa, sbs[i % NSETS]), 1e-2,
                       o[name])

    ours("fp8_blk", a.sa_blk, wt.sb_blk)
    ours("fp8_blk_nopdl", a.sa_blk, wt.sb_blk, nopdl)
    if tuned is not None and tuned != cfg:
        ours("fp8_tuned", a.sa_blk, wt.sb_blk, tuned)
    ours("fp8_row", a.sa_row, wt.sb_col)
    ours("fp8_ten", a.sa_ten, wt.sb_ten)
    ref_blk = lambda i: fp8.dequant_reference(a.x, wt.w[i % NSETS], a.sa_blk, wt.sb_blk[i % NSETS])  # noqa: E731
    if wt.torch_blk_wrong:
        # once wrong for a shape it is not run again there: the same calls have also faulted
        # (an illegal address at M = 3 of dsv3_mlp_down, 2026-12-01T1441), killing the process
        log("    torch_blk: skipped (wrong for this shape at a smaller M)")
    else:
        try:
            f_time, f_check, label = torch_block_call(a, wt, m)
            paths["torch_blk"] = (f_time, ref_blk, 1e-2, None, f_check)
            if label != "torch_blk":
                log(f"    torch_blk: cuBLASLt refused M={m}, timed as {label}")
        except Exception as e:
            log(f"    torch_blk unavailable: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    for fast in (False, True):
        sfx = "_fast" if fast else ""
        paths["torch_row" + sfx] = (
            lambda i, fast=fast: torch._scaled_mm(a.x, wt.w[i % NSETS].t(), scale_a=a.sa_row,
                                                  scale_b=wt.sb_col[i % NSETS].t(), out_dtype=BF16,
                                                  use_fast_accum=fast),
            lambda i: fp8.dequant_reference(a.x, wt.w[i % NSETS], a.sa_row, wt.sb_col[i % NSETS]), 1e-2, None)
        paths["torch_ten" + sfx] = (
            lambda i, fast=fast: torch._scaled_mm(a.x, wt.w[i % NSETS].t(), scale_a=a.sa_ten,
                                                  scale_b=wt.sb_ten[i % NSETS], out_dtype=BF16,
                                                  use_fast_accum=fast),
            lambda i: fp8.dequant_reference(a.x, wt.w[i % NSETS], a.sa_ten, wt.sb_ten[i % NSETS]), 1e-2, None)
    if wt.wb is not None and ec.supports(m, n, k, BF16, k, n) is None:
        xb = (a.x.float() * fp8._expand_scale(a.sa_blk, "block", m, k, "a")).to(BF16)

        def bf16_cute(i):
            return ec.skinny_gemm(xb, wt.wb[i % NSETS], o["bf16_cute"][i % NSETS])

        def bf16_ref(i):
            xb.copy_((a.x.float() * fp8._expand_scale(a.sa_blk, "block", m, k, "a")).to(BF16))
            return xb.float() @ wt.wb[i % NSETS].float().t()

        paths["bf16_cute"] = (bf16_cute, bf16_ref, 1e-2, o["bf16_cute"])
    return paths


def check_paths(paths: dict, a: Acts, log) -> dict:
    """Fresh inputs, poisoned outputs, error vs fp32; returns name -> rel err (inf = failed)."""
    errs = {}
    for name, spec in list(paths.items()):
        f, ref, tol, out = spec[:4]
        f_check = spec[4] if len(spec) > 4 else f
        try:
            a.refresh()
            worst = 0.0
            for i in range(NSETS):
                if out is not None:
                    out[i].fill_(float("nan"))
                r = ref(i)  # before the call: bf16_ref refreshes its derived input
                y = f_check(i)
                torch.cuda.synchronize()
                y = out[i] if out is not None else y
                worst = max(worst, rel_err(y, r))
            errs[name] = worst
            if not worst < tol:
                log(f"    {name}: WRONG, rel err {worst:.3e} >= {tol} (not timed)")
                del paths[name]
        except Exception as e:
            errs[name] = float("inf")
            log(f"    {name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300]} (not timed)")
            del paths[name]
    return errs


def fmt(v, nd=2):
    return "-" if v is None else f"{v:.{nd}f}"


COLS = ["fp8_blk", "fp8_tuned", "fp8_blk_nopdl", "fp8_row", "fp8_ten", "torch_blk", "torch_row",
        "torch_ten", "bf16_cute"]


def bench_shape(name, n, k, ms, args, bw, log, rows, best):
    wt = Weights(n, k, bf16=not args.no_bf16)
    for m in ms:
        try:
            a = Acts(m, k)
            outs = {p: [torch.empty(m, n, device="cuda", dtype=BF16) for _ in range(NSETS)]
                    for p in ("fp8_blk", "fp8_tuned", "fp8_blk_nopdl", "fp8_row", "fp8_ten", "bf16_cute")}
            # the sweep's best is the fp8_tuned (block-scale) column only when it swept block scales
            tuned = (best.get(name, {}).get(8 if m <= 8 else 16, {}).get("best")
                     if args.sweep_kinds == "block" else None)
            paths = make_paths(a, wt, m, outs, log, tuned)
            errs = check_paths(paths, a, log)
            if "torch_blk" in errs and not errs["torch_blk"] < 1e-2:
                wt.torch_blk_wrong = True
            t = time_graphs({p: spec[0] for p, spec in paths.items()}, args.iters, args.trials)
            if "fp8_tuned" not in paths and tuned is not None and "fp8_blk" in t:
                t["fp8_tuned"] = t["fp8_blk"]  # the sweep's best is the default
            for base in ("torch_row", "torch_ten"):  # torch's best accumulation mode
                cands = [t[p] for p in (base, base + "_fast") if p in t]
                t[base] = min(cands) if cands else None
            floor = wt.bytes_fp8(m) / bw * 1e6
            row = {"shape": name, "N": n, "K": k, "M": m, "floor_us": floor,
                   "us": {c: t.get(c) for c in COLS}, "rel_err": errs,
                   "config": fp8.default_fp8_config(m, n, k).key()}
            ours = t.get("fp8_blk")
            row["blk_over_floor"] = ours / floor if ours else None
            row["tuned_over_floor"] = t["fp8_tuned"] / floor if t.get("fp8_tuned") else None
            row["tuned_config"] = tuned.key() if tuned is not None else None
            row["torch_blk_speedup"] = t["torch_blk"] / ours if ours and t.get("torch_blk") else None
            row["torch_row_speedup"] = t["torch_row"] / t["fp8_row"] if t.get("torch_row") and t.get("fp8_row") else None
            row["torch_ten_speedup"] = t["torch_ten"] / t["fp8_ten"] if t.get("torch_ten") and t.get("fp8_ten") else None
            row["bf16_over_fp8"] = t["bf16_cute"] / ours if ours and t.get("bf16_cute") else None
            rows.append(row)
            log("| " + " | ".join([str(m), name] + [fmt(t.get(c)) for c in COLS] + [
                fmt(floor), fmt(row["blk_over_floor"], 3), fmt(row["tuned_over_floor"], 3),
                fmt(row["torch_blk_speedup"], 3),
                fmt(row["torch_row_speedup"], 3), fmt(row["torch_ten_speedup"], 3),
                fmt(row["bf16_over_fp8"], 3), f"{max(v for k_, v in errs.items() if k_.startswith('fp8')):.1e}"]) + " |")
            del a, outs, paths
        except Exception as e:
            log(f"| {m} | {name} | FAILED: {type(e).__name__}: {str(e).splitlines()[0][:300]} |")
            traceback.print_exc()


# --------------------------------------------------------------------------------------
SWEEP_KINDS = {"block": ("block", "block"), "tensor": ("tensor", "tensor")}


def candidates(mode: str, m: int, n: int, k: int, kinds: str = "block"):
    if mode == "grid":
        return fp8.fp8_config_grid(m, n, k)
    if mode == "bulk":
        return fp8.fp8_bulk_grid(m, n, k)
    if mode == "ahead":
        return fp8.fp8_ahead_grid(m, n, k)
    if mode == "bulk-ahead":  # the rings with x and the scales 1-3 iterations ahead
        return fp8.fp8_ahead_grid(m, n, k, base=fp8.fp8_bulk_grid(m, n, k))
    if mode == "pre":  # L2 prefetch before the PDL wait, room for the next kernel's blocks
        return fp8.fp8_pre_grid(m, n, k)
    if mode == "wg":  # the warpgroup kernel: wgmma on fp8 operands, no conversion
        return fp8.fp8_wg_grid(m, n, k)
    if mode == "wgr":  # the register-weights warpgroup kernel: weights as wgmma A from registers
        return fp8.fp8_wgr_grid(m, n, k)
    if mode == "hold":  # rings filled before the PDL wait beside the running kernel's blocks
        return fp8.fp8_hold_grid(m, n, k)
    return fp8.fp8_configs_for(m, n, k, kinds=SWEEP_KINDS[kinds])


def sweep_shape(name, n, k, args, log, best):
    """Times the sweep's candidates (candidates()) at M = 8 and 16 (one per m_tile: the kernel is the same
    for every M of a bucket) with the scale kinds of --sweep-kinds and records the fastest correct one
    per bucket in best[name]."""
    wt = Weights(n, k, bf16=False)
    for m in (8, 16):
        try:
            a = Acts(m, k)
            sa, sbs = (a.sa_ten, wt.sb_ten) if args.sweep_kinds == "tensor" else (a.sa_blk, wt.sb_blk)
            out = [torch.empty(m, n, device="cuda", dtype=BF16) for _ in range(NSETS)]
            fns = {}
            for cfg in candidates(args.sweep, m, n, k, args.sweep_kinds):
                try:
                    a.refresh()
                    out[0].fill_(float("nan"))
                    fp8.gemm_fp8(a.x, wt.w[0], sa, sbs[0], out[0], config=cfg)
                    torch.cuda.synchronize()
                    err = rel_err(out[0], fp8.dequant_reference(a.x, wt.w[0], sa, sbs[0]))
                    if not err < 1e-2:
                        log(f"    sweep {name} M={m} {cfg.key()}: WRONG rel err {err:.2e}")
                        continue
                except Exception as e:
                    log(f"    sweep {name} M={m} {cfg.key()}: FAILED {type(e).__name__}: {str(e)[:200]}")
                    continue
                fns[cfg.key()] = (lambda i, cfg=cfg, a=a, out=out, sa=sa, sbs=sbs: fp8.gemm_fp8(
                    a.x, wt.w[i % NSETS], sa, sbs[i % NSETS], out[i % NSETS], config=cfg), cfg)
            t = time_graphs({k_: v[0] for k_, v in fns.items()}, args.iters, args.trials)
            default = fp8.default_fp8_config(m, n, k, kinds=SWEEP_KINDS[args.sweep_kinds]).key()
            order = sorted(t, key=t.get)
            log(f"  sweep {name} M={m}: default {default} {fmt(t.get(default))} us; best "
                + ", ".join(f"{k_} {t[k_]:.2f}" for k_ in order[:4]))
            best.setdefault(name, {})[m] = {"best": fns[order[0]][1], "best_us": t[order[0]],
                                            "default": default, "default_us": t.get(default),
                                            "all_us": t, "configs": {k_: fns[k_][1].to_dict() for k_ in t}}
        except Exception as e:
            log(f"  sweep {name} M={m}: FAILED {type(e).__name__}: {str(e)[:300]}")


def _compile_worker(job):
    kind, cfg_d, n, k, ka, kb_, o = job
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    try:
        if kind == "fp8":
            fp8.get_fp8_kernel(fp8.Fp8Config.from_dict(cfg_d), n, k, ka, kb_, o, arch="sm_90a")
        else:
            ec.get_kernel(ec.Config.from_dict(cfg_d), n, k, arch="sm_90a")
        return None
    except Exception as e:  # reported, the main process compiles it again (and reports there)
        return f"{kind} {n}x{k} {cfg_d}: {type(e).__name__}: {str(e)[:200]}"


def gpu_test_kernels() -> set:
    """The fp8 kernels tests/test_cute_fp8_gpu.py's tests compile (so gpu_suite.sh does not
    compile them on the GPU's clock); a kernel missing here is only compiled there."""
    out = set()
    for n, k in ((2112, 7168), (3072, 1536), (4096, 512), (512, 7168), (7168, 256), (144, 7168),
                 (1536, 128), (6144, 7168)):
        for m in (1, 16):
            out.add(("fp8", fp8.default_fp8_config(m, n, k).to_json(), n, k, "block", "block", "bfloat16"))
    for m in (1, 16):
        c = fp8.default_fp8_config(m, 1000, 1024).to_json()
        for ka, kb_ in (("tensor", "tensor"), ("row", "col"), ("block", "tensor"), ("tensor", "block"),
                        ("row", "block"), ("block", "col")):
            out.add(("fp8", c, 1000, 1024, ka, kb_, "float32"))
    for m in (4, 12):
        for c in fp8.fp8_configs_for(m, 2112, 7168):
            out.add(("fp8", c.to_json(), 2112, 7168, "block", "block", "bfloat16"))
    for m in (3, 16):  # test_gpu_bulk_ring_configs
        for n, k in ((2112, 7168), (4608, 7168)):
            for c in fp8.fp8_bulk_grid(m, n, k)[1::7]:
                out.add(("fp8", c.to_json(), n, k, "block", "block", "bfloat16"))
    c = dataclasses.replace(fp8.default_fp8_config(5, 512, 1024), timeline=True)  # test_gpu_timeline_...
    out.add(("fp8", c.to_json(), 512, 1024, "block", "block", "bfloat16"))
    for m in (5, 16):  # test_gpu_l2_prefetch_configs
        for n, k in ((2112, 7168), (7168, 2048)):
            for c in [c for c in fp8.fp8_pre_grid(m, n, k) if c.l2pre][::4]:
                out.add(("fp8", c.to_json(), n, k, "block", "block", "bfloat16"))
    for m in (3, 16):  # test_gpu_wg_configs
        for n, k in ((2112, 7168), (7168, 2048), (6144, 7168)):
            grid = fp8.fp8_wg_grid(m, n, k)
            for c in grid[1::6]:
                out.add(("fp8", c.to_json(), n, k, "block", "block", "bfloat16"))
            out.add(("fp8", grid[1].to_json(), n, k, "row", "col", "float32"))
    for m in (3, 16):  # test_gpu_wgr_configs
        for n, k in ((2112, 7168), (7168, 2048), (4096, 512), (7168, 2304), (1536, 128)):
            grid = fp8.fp8_wgr_grid(m, n, k)
            for c in grid[1::3]:
                out.add(("fp8", c.to_json(), n, k, "block", "block", "bfloat16"))
            out.add(("fp8", grid[1].to_json(), n, k, "row", "col", "float32"))
    return out


def precompile(shapes, ms, sweep: str | None, bf16: bool, jobs: int, log, tests: bool = False,
               sweep_kinds: str = "block"):
    """Compile every kernel the run needs for sm_90a into the disk cache (no GPU needed), in
    `jobs` processes (cute.compile is not thread-safe; processes are fine)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    want = {("fp8", BW_CFG.to_json(), BW_N, BW_K, "block", "block", "bfloat16")}
    for n, k in shapes.values():
        for m in ms:
            c = fp8.default_fp8_config(m, n, k)
            for ka, kb_ in (("block", "block"), ("row", "col"), ("tensor", "tensor")):
                ck = fp8.default_fp8_config(m, n, k, kinds=(ka, kb_))
                want.add(("fp8", ck.to_json(), n, k, ka, kb_, "bfloat16"))
            want.add(("fp8", dataclasses.replace(c, pdl=False).to_json(), n, k, "block", "block", "bfloat16"))
            if bf16 and ec.supports(m, n, k, BF16, k, n) is None:
                want.add(("bf16", ec.default_config(m, n, k).to_json(), n, k, "", "", ""))
        if sweep:
            for m in (8, 16):
                for c in candidates(sweep, m, n, k, sweep_kinds):
                    want.add(("fp8", c.to_json(), n, k, *SWEEP_KINDS[sweep_kinds], "bfloat16"))
    if tests:
        want |= gpu_test_kernels()
    jobs_l = [(kd, json.loads(c), n, k, ka, kb_, o) for kd, c, n, k, ka, kb_, o in sorted(want)]
    t0 = time.time()
    if jobs <= 1:
        errs = [e for e in map(_compile_worker, jobs_l) if e]
    else:
        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as ex:
            errs = [e for e in ex.map(_compile_worker, jobs_l) if e]
    log(f"precompiled {len(jobs_l)} kernels in {jobs} processes in {time.time() - t0:.0f} s "
        f"into {ec.cache_dir()}" + (f"; {len(errs)} failed, first: {errs[0]}" if errs else ""))


# --------------------------------------------------------------------------------------
def start_report(out: Path, title: str):
    """(the Report at `out`, the GPU's properties) with the run's header written, or (report,
    None) after a line saying why there is no GPU to run on."""
    log = Report(out)
    if not torch.cuda.is_available() or not ec.available():
        log("needs a CUDA GPU with cc >= 9.0 and nvidia-cutlass-dsl")
        return log, None
    props = torch.cuda.get_device_properties(0)
    log(f"# {title}, {props.name}, {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}")
    log(f"command: {' '.join(sys.argv)}")
    log(f"torch {torch.__version__} (CUDA {torch.version.cuda}), nvidia-cutlass-dsl {ec._cutlass_version()}, "
        f"{props.multi_processor_count} SMs")
    return log, props


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/fp8_gemm/fp8_gemm.md",
                    help="markdown report (a .json with the numbers next to it)")
    ap.add_argument("--precompile", action="store_true",
                    help="only compile the run's kernels for sm_90a into the disk cache (no GPU)")
    ap.add_argument("--ms", default="1-16", help="M values: 1-16 or 1,2,4,8")
    ap.add_argument("--shapes", default="", help="comma-separated names (default: all)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--sweep", nargs="?", const="near", default=None, choices=("near", "grid", "bulk", "ahead", "bulk-ahead", "pre", "hold", "wg", "wgr"),
                    help="time config candidates at M = 8 and 16 first: near = fp8_configs_for (one"
                         " setting varied at a time), grid = fp8_config_grid (combinations), bulk ="
                         " fp8_bulk_grid (bulk-copy rings), ahead = fp8_ahead_grid (near, x loaded 1-3"
                         " iterations ahead), bulk-ahead = the rings so, pre = fp8_pre_grid (L2 prefetch"
                         " before the PDL wait, early launch, room for the next kernel's blocks), hold ="
                         " fp8_hold_grid (rings filled before the wait beside the running kernel), wg ="
                         " fp8_wg_grid (the warpgroup wgmma kernel), wgr = fp8_wgr_grid (weights as wgmma A from"
                         " registers)")
    ap.add_argument("--sweep-kinds", choices=sorted(SWEEP_KINDS), default="block",
                    help="scale kinds the sweep times with (tensor: per-tensor scales on both operands,"
                         " for fp8_defaults.MEASURED_TENSOR)")
    ap.add_argument("--jobs", type=int, default=0, help="precompile in this many processes first")
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 CuTe comparison")
    args = ap.parse_args()
    if "-" in args.ms:
        lo, hi = (int(v) for v in args.ms.split("-"))
        ms = list(range(lo, hi + 1))
    else:
        ms = [int(v) for v in args.ms.split(",")]
    shapes = {k_: v for k_, v in SHAPES.items()
              if not args.shapes or k_ in args.shapes.split(",") or k_.split("_", 1)[1] in args.shapes.split(",")}
    if args.precompile:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        precompile(shapes, ms, args.sweep, not args.no_bf16, max(args.jobs, 1), print, tests=True,
                   sweep_kinds=args.sweep_kinds)
        return 0
    out = Path(args.out)
    log, props = start_report(out, "fp8 decode GEMMs")
    if props is None:
        return 1
    if args.jobs > 0:
        precompile(shapes, ms, args.sweep, not args.no_bf16, args.jobs, log, sweep_kinds=args.sweep_kinds)
    bw = read_bandwidth()
    log(f"read bandwidth (torch.sum over 2 GiB bf16): {bw / 1e12:.3f} TB/s")
    try:
        log(f"fp8 kernel streaming a 1 GiB weight: {kernel_bandwidth() / 1e12:.3f} TB/s")
    except Exception as e:
        log(f"fp8 kernel 1 GiB stream FAILED: {type(e).__name__}: {str(e)[:300]}")
    log(f"CUDA-graph replay, {args.iters} calls per graph over {NSETS} rotated weight sets, median of "
        f"{args.trials} trials; us per GEMM. Our kernels launch with PDL (consecutive calls overlap "
        "their prologues, as in a model); fp8_blk_nopdl shows the same kernel without it.")
    log(f"floor = (N*K + 4*(ceil(N/128)*K/128 + M*K/128)) bytes / read bandwidth. Targets: fp8_blk <= "
        f"{TARGET_FLOOR}x floor, >= {TARGET_TORCH}x faster than torch's scaled matmul.")
    log("")
    hdr = ["M", "shape"] + [f"{c} us" for c in COLS] + ["floor us", "blk/floor", "tuned/floor", "torch_blk/fp8",
                                                      "torch_row/fp8", "torch_ten/fp8", "bf16/fp8",
                                                      "max fp8 err"]
    best = {}
    if args.sweep:
        log(f"## config sweep ({args.sweep_kinds} scales; the best per M bucket"
            + (" is the fp8_tuned column below)" if args.sweep_kinds == "block" else "; the fp8_ten column runs the default)"))
        for name, (n, k) in shapes.items():
            sweep_shape(name, n, k, args, log, best)
            torch.cuda.empty_cache()
        log("")
    log("| " + " | ".join(hdr) + " |")
    log("|" + "---:|" * len(hdr))
    rows = []
    for name, (n, k) in shapes.items():
        try:
            bench_shape(name, n, k, ms, args, bw, log, rows, best)
            torch.cuda.empty_cache()
        except Exception as e:  # a faulted device fails every later call: keep what was measured
            log(f"| - | {name} | FAILED: {type(e).__name__}: {str(e).splitlines()[0][:300]} |")
            traceback.print_exc()
            break
    summarize(rows, log)
    best_json = {nm: {m: {**v, "best": v["best"].to_dict()} for m, v in d.items()} for nm, d in best.items()}
    res = {"device": props.name, "bandwidth_Bps": bw, "args": vars(args), "rows": rows, "sweep": best_json,
           "sweep_kinds": args.sweep_kinds}
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    log(f"\nnumbers: {out.with_suffix('.json')}")
    return 0


def summarize(rows, log):
    log("")
    log("## summary")
    if not rows:
        log("no rows")
        return
    for name in dict.fromkeys(r["shape"] for r in rows):
        rs = [r for r in rows if r["shape"] == name]
        fl = [r["blk_over_floor"] for r in rs if r["blk_over_floor"]]
        tf = [r["tuned_over_floor"] for r in rs if r["tuned_over_floor"]]
        sp = [r["torch_blk_speedup"] or r["torch_row_speedup"] for r in rs]
        sp = [v for v in sp if v]
        b16 = [r["bf16_over_fp8"] for r in rs if r["bf16_over_fp8"]]
        log(f"- {name}: fp8_blk/floor {fmt(min(fl, default=None), 3)}..{fmt(max(fl, default=None), 3)}"
            f" (<= {TARGET_FLOOR} at {sum(v <= TARGET_FLOOR for v in fl)}/{len(rs)} M)"
            + (f", tuned {fmt(min(tf), 3)}..{fmt(max(tf), 3)}" if tf else "") + "; vs torch "
            f"{fmt(min(sp, default=None), 3)}..{fmt(max(sp, default=None), 3)} (>= {TARGET_TORCH} at "
            f"{sum(v >= TARGET_TORCH for v in sp)}/{len(rs)} M); bf16 cute / fp8 "
            f"{fmt(min(b16, default=None), 2)}..{fmt(max(b16, default=None), 2)}")
    allf = [r["blk_over_floor"] for r in rows if r["blk_over_floor"]]
    log(f"all: fp8_blk within {TARGET_FLOOR}x of the floor at {sum(v <= TARGET_FLOOR for v in allf)}/"
        f"{len(rows)} (shape, M) points")


if __name__ == "__main__":
    sys.exit(main())
