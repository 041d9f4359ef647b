#!/usr/bin/env python3
"""Kimi-K3 KDA decode projections on one GPU: correctness, config sweep and timing.

Paths timed per M (CUDA-graph replay, 4 rotated weight sets, median of trials):
  (a) seq_torch   x @ W_packed[6288,7168]^T, split, f_a @ F_B^T            (torch.mm)
  (b) 2s_torch    main: QKVG; aux: F_A/beta then F_B; fork/join events    (torch.mm)
  (c) 2s_cute     same two-stream structure with executors.cute kernels
  (e) packed_cute x @ W_packed^T with the streaming kernel, then F_B on the in-place
                  f_a view (one stream, PDL chained)
  (f) fused_cute  ONE kernel (executors.cute.kda_fused_step): packed streaming GEMM whose
                  f_a blocks run first and publish through a self-resetting counter; the
                  last blocks compute F_B from f_a inside the same grid
  (d) floor       weight bytes / read bandwidth measured in this run

Usage: python scripts/bench_kda_kernels.py [--out DIR] [--quick] [--sanitize] [--no-sweep]
       [--fused-sweep] [--precompile]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import time
from pathlib import Path

import torch

import executors.cute as ec
from executors.cute.config import Config
from executors.tools.timing import median_event_us, time_graphs

H, NQ, NFAB, NFA, NFB = 7168, 6144, 144, 128, 1536
NP = NQ + NFAB  # 6288 packed rows
NSETS = 4
WEIGHT_BYTES = NP * H * 2 + NFB * NFA * 2


def log(*a):
    print(*a, flush=True)


def check(out, ref, tag):
    o = out.float()
    if not torch.isfinite(o).all():
        raise AssertionError(f"{tag}: non-finite output")
    cos = torch.nn.functional.cosine_similarity(o.flatten(), ref.flatten(), dim=0).item()
    rel = ((o - ref).norm() / ref.norm()).item()
    if not (cos > 0.999 and rel < 1e-2):
        raise AssertionError(f"{tag}: cos {cos:.6f} rel {rel:.2e}")
    return cos, rel


# --------------------------------------------------------------------------------------
def correctness(ms, graph=True):
    worst = {}
    for m in ms:
        x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
        wp = torch.randn(NP, H, device="cuda", dtype=torch.bfloat16) / H**0.5
        wfb = torch.randn(NFB, NFA, device="cuda", dtype=torch.bfloat16) / NFA**0.5
        q = torch.full((m, NQ), float("nan"), device="cuda", dtype=torch.bfloat16)
        fab = torch.full((m, NFAB), float("nan"), device="cuda", dtype=torch.bfloat16)
        g1 = torch.full((m, NFB), float("nan"), device="cuda", dtype=torch.bfloat16)
        y = torch.full((m, NP), float("nan"), device="cuda", dtype=torch.bfloat16)
        g1p = torch.full((m, NFB), float("nan"), device="cuda", dtype=torch.bfloat16)
        ec.skinny_gemm(x, wp[:NQ], q)
        ec.skinny_gemm(x, wp[NQ:], fab)
        ec.skinny_gemm(fab[:, :NFA], wfb, g1)
        ec.skinny_gemm(x, wp, y)
        ec.skinny_gemm(y[:, NQ:NQ + NFA], wfb, g1p)
        torch.cuda.synchronize()
        ref = x.float() @ wp.float().t()
        res = {
            "qkvg": check(q, ref[:, :NQ], f"qkvg M={m}"),
            "fab": check(fab, ref[:, NQ:], f"fab M={m}"),
            "fb": check(g1, fab[:, :NFA].float() @ wfb.float().t(), f"fb M={m}"),
            "packed": check(y, ref, f"packed M={m}"),
            "fb_packed": check(g1p, y[:, NQ:NQ + NFA].float() @ wfb.float().t(), f"fbp M={m}"),
        }
        # (f) fused step: poisoned outputs, fp32 reference, out as a strided row view
        yb = torch.full((m, NP + 16), float("nan"), device="cuda", dtype=torch.bfloat16)
        yf = yb[:, 8:8 + NP]
        g1f = torch.full((m, NFB), float("nan"), device="cuda", dtype=torch.bfloat16)
        ec.kda_fused_step(x, wp, wfb, yf, g1f, fa_col=NQ)
        torch.cuda.synchronize()
        res["fused_out"] = check(yf, ref, f"fused out M={m}")
        res["fused_g1"] = check(g1f, yf[:, NQ:NQ + NFA].float() @ wfb.float().t(), f"fused g1 M={m}")
        res["fused_g1_vs_fp32"] = check(g1f, ref[:, NQ:NQ + NFA] @ wfb.float().t(), f"fused g1/fp32 M={m}")
        assert torch.isnan(yb[:, :8].float()).all() and torch.isnan(yb[:, 8 + NP:].float()).all()
        # the single fused kernel forced (the default dispatch uses two launches for M > 8)
        yf.fill_(float("nan"))
        g1f.fill_(float("nan"))
        ec.kda_fused_step(x, wp, wfb, yf, g1f, fa_col=NQ,
                          config=ec.default_fused_config(m, NP, H, NFA, NQ))
        torch.cuda.synchronize()
        res["fused_kernel_out"] = check(yf, ref, f"fused kernel out M={m}")
        res["fused_kernel_g1"] = check(g1f, ref[:, NQ:NQ + NFA] @ wfb.float().t(),
                                       f"fused kernel g1 M={m}")
        # swapped mma roles on the prepacked weight (what the compiled plan's chain runs)
        yf.fill_(float("nan"))
        g1f.fill_(float("nan"))
        ec.kda_fused_step(x, wp, wfb, yf, g1f, fa_col=NQ, w_swap=ec.tile_weights(wp, 2))
        torch.cuda.synchronize()
        res["fused_swap_out"] = check(yf, ref, f"fused swap out M={m}")
        res["fused_swap_g1"] = check(g1f, ref[:, NQ:NQ + NFA] @ wfb.float().t(), f"fused swap g1 M={m}")
        if graph:
            # fused: captured twice in one graph on a side stream (self-reset within a
            # replay), replayed three times with fresh x and poisoned outputs
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            y2 = torch.empty_like(y)
            g12 = torch.empty_like(g1)
            with torch.cuda.stream(side):
                ec.kda_fused_step(x, wp, wfb, y2, g12, fa_col=NQ)
            torch.cuda.synchronize()
            gf = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gf, stream=side):
                ec.kda_fused_step(x, wp, wfb, yf, g1f, fa_col=NQ)
                ec.kda_fused_step(x, wp, wfb, y2, g12, fa_col=NQ)
            for rep in range(3):
                for t in (yf, g1f, y2, g12):
                    t.fill_(float("nan"))
                x.copy_(torch.randn_like(x))
                gf.replay()
                torch.cuda.synchronize()
                ref = x.float() @ wp.float().t()
                rg = ref[:, NQ:NQ + NFA] @ wfb.float().t()
                res["graph_fused_out"] = check(yf, ref, f"graph fused out M={m} rep {rep}")
                res["graph_fused_g1"] = check(g1f, rg, f"graph fused g1 M={m} rep {rep}")
                res["graph_fused_out2"] = check(y2, ref, f"graph fused out2 M={m} rep {rep}")
                res["graph_fused_g1_2"] = check(g12, rg, f"graph fused g1(2) M={m} rep {rep}")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=side):
                ec.skinny_gemm(x, wp[:NQ], q)
                ec.skinny_gemm(x, wp[NQ:], fab)
                ec.skinny_gemm(fab[:, :NFA], wfb, g1)
            for t in (q, fab, g1):
                t.fill_(float("nan"))
            x.copy_(torch.randn_like(x))
            g.replay()
            torch.cuda.synchronize()
            ref = x.float() @ wp.float().t()
            res["graph_qkvg"] = check(q, ref[:, :NQ], f"graph qkvg M={m}")
            res["graph_fab"] = check(fab, ref[:, NQ:], f"graph fab M={m}")
            res["graph_fb"] = check(g1, fab[:, :NFA].float() @ wfb.float().t(), f"graph fb M={m}")
        for k, (cos, rel) in res.items():
            w = worst.setdefault(k, [1.0, 0.0])
            w[0] = min(w[0], cos)
            w[1] = max(w[1], rel)
    return worst


# --------------------------------------------------------------------------------------
def time_graph(fns: dict, iters=20, trials=7):
    """fns: name -> f(i). One graph per name (iters steps over the NSETS weight sets), replayed in
    alternating order (executors.tools.timing)."""
    return time_graphs(fns, iters=iters, trials=trials, warmup=1, nsets=NSETS, order="alternate")


def read_bandwidth():
    big = torch.empty(1 << 30, device="cuda", dtype=torch.bfloat16).uniform_()
    res = {"torch_sum_2GiB_TBps": big.numel() * 2 / median_event_us(lambda: torch.sum(big, dtype=torch.float32)) / 1e6}
    big = None
    # the streaming kernel itself on a 705 MB weight (8 x QKVG rows)
    wbig = torch.empty(8 * NQ, H, device="cuda", dtype=torch.bfloat16).uniform_(-0.01, 0.01)
    x = torch.randn(8, H, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(8, 8 * NQ, device="cuda", dtype=torch.bfloat16)
    cfg = ec.default_config(8, NQ, H)
    us = median_event_us(lambda: ec.skinny_gemm(x, wbig, out, cfg))
    res["stream_kernel_705MB_TBps"] = wbig.numel() * 2 / us / 1e6
    wbig = None
    torch.cuda.empty_cache()
    return res


# --------------------------------------------------------------------------------------
class Problem:
    def __init__(self, m):
        self.m = m
        self.x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
        self.wp = [torch.randn(NP, H, device="cuda", dtype=torch.bfloat16) / H**0.5
                   for _ in range(NSETS)]
        self.wfb = [torch.randn(NFB, NFA, device="cuda", dtype=torch.bfloat16) / NFA**0.5
                    for _ in range(NSETS)]
        z = lambda n: [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(NSETS)]  # noqa: E731
        self.y, self.q, self.fab, self.g1 = z(NP), z(NQ), z(NFAB), z(NFB)
        self._wpt = {}
        self.aux = torch.cuda.Stream()
        self.ev = [(torch.cuda.Event(), torch.cuda.Event()) for _ in range(64)]
        self.k = 0

    def wpt(self, wl):  # the packed weights in a prepacked layout (configs with wl), made once
        if wl not in self._wpt:
            self._wpt[wl] = [ec.tile_weights(w, wl) for w in self.wp]
        return self._wpt[wl]

    def _w(self, cfg):
        return self.wpt(cfg.weight_layout) if cfg is not None and cfg.weight_layout else self.wp

    def _fork_join(self, i, main_fn, aux_fn):
        cur = torch.cuda.current_stream()
        e0, e1 = self.ev[self.k % len(self.ev)]
        self.k += 1
        e0.record(cur)
        self.aux.wait_event(e0)
        with torch.cuda.stream(self.aux):
            aux_fn(i)
            e1.record(self.aux)
        main_fn(i)
        cur.wait_event(e1)

    # (a)
    def seq_torch(self, i):
        j = i % NSETS
        torch.mm(self.x, self.wp[j].t(), out=self.y[j])
        torch.mm(self.y[j][:, NQ:NQ + NFA], self.wfb[j].t(), out=self.g1[j])

    # (b)
    def two_torch(self, i):
        j = i % NSETS

        def aux(_):
            torch.mm(self.x, self.wp[j][NQ:].t(), out=self.fab[j])
            torch.mm(self.fab[j][:, :NFA], self.wfb[j].t(), out=self.g1[j])

        self._fork_join(i, lambda _: torch.mm(self.x, self.wp[j][:NQ].t(), out=self.q[j]), aux)

    # (c)
    def make_two_cute(self, cq, cab, cb):
        def run(i):
            j = i % NSETS

            def aux(_):
                ec.skinny_gemm(self.x, self.wp[j][NQ:], self.fab[j], cab)
                ec.skinny_gemm(self.fab[j][:, :NFA], self.wfb[j], self.g1[j], cb)

            self._fork_join(i, lambda _: ec.skinny_gemm(self.x, self.wp[j][:NQ], self.q[j], cq), aux)

        return run

    # (e)
    def make_packed_cute(self, cp, cb):
        wp = self._w(cp)

        def run(i):
            j = i % NSETS
            ec.skinny_gemm(self.x, wp[j], self.y[j], cp)
            ec.skinny_gemm(self.y[j][:, NQ:NQ + NFA], self.wfb[j], self.g1[j], cb)

        return run

    # (f)
    def make_fused(self, cf=None):
        wp = self._w(cf)

        def run(i):
            j = i % NSETS
            ec.kda_fused_step(self.x, wp[j], self.wfb[j], self.y[j], self.g1[j], fa_col=NQ,
                              config=cf)

        return run

    def single(self, which, cfg=None, use_torch=False):
        def run(i):
            j = i % NSETS
            if which == "qkvg":
                x, w, o = self.x, self.wp[j][:NQ], self.q[j]
            elif which == "packed":
                x, w, o = self.x, self._w(cfg)[j], self.y[j]
            elif which == "fab":
                x, w, o = self.x, self.wp[j][NQ:], self.fab[j]
            else:
                x, w, o = self.fab[j][:, :NFA], self.wfb[j], self.g1[j]
            if use_torch:
                torch.mm(x, w.t(), out=o)
            else:
                ec.skinny_gemm(x, w, o, cfg)

        return run


def shape_of(which):
    return {"qkvg": (NQ, H), "packed": (NP, H), "fab": (NFAB, H), "fb": (NFB, NFA)}[which]


def verify_cfg(p, which, cfg):
    n, k = shape_of(which)
    j = 0
    f = p.single(which, cfg)
    if which == "fb":
        p.fab[j].copy_(torch.randn_like(p.fab[j]))
    o = {"qkvg": p.q, "packed": p.y, "fab": p.fab, "fb": p.g1}[which][j]
    o.fill_(float("nan"))
    f(0)
    torch.cuda.synchronize()
    if which == "fb":
        ref = p.fab[j][:, :NFA].float() @ p.wfb[j].float().t()
    else:
        w = {"qkvg": p.wp[j][:NQ], "packed": p.wp[j], "fab": p.wp[j][NQ:]}[which]
        ref = p.x.float() @ w.float().t()
    check(o, ref, f"{which} {cfg.key()}")


def sweep_candidates(which, m):
    mt8 = 8 if m <= 8 else 16
    if which in ("qkvg", "packed"):
        combos = [(1, 4, 4), (1, 8, 4), (1, 8, 7), (2, 4, 4), (2, 8, 2), (2, 8, 4), (2, 8, 7),
                  (4, 4, 2), (4, 8, 2), (4, 8, 4), (1, 16, 2), (2, 16, 2), (2, 4, 8), (1, 4, 8),
                  (1, 8, 2), (1, 4, 7), (1, 2, 8), (4, 4, 4), (8, 4, 2), (8, 8, 1)]
        cands = [Config("stream", m_tile=mt8, tiles=t, warps_k=wk, unroll=u) for t, wk, u in combos]
    elif which == "fb":
        combos = [(1, 1, 1, 4), (1, 2, 1, 4), (1, 4, 1, 4), (2, 1, 1, 4), (1, 1, 4, 1),
                  (1, 2, 2, 2), (1, 4, 2, 2), (1, 1, 2, 2), (2, 2, 2, 2), (1, 2, 4, 1), (2, 1, 4, 1)]
        cands = [Config("split_k", m_tile=mt8, tiles=t, warps_n=wn, warps_k=wk, unroll=u)
                 for t, wn, wk, u in combos]
    else:
        mt = 1 << (m - 1).bit_length()
        cands = [Config("split_n", m_tile=mt, rows=r, vec=v) for r in (1, 2, 3) for v in (1, 2, 4)]
    n, k = shape_of(which)
    return [c for c in cands if c.check(m, n, k) is None]


def sweep(which, m, iters=20, trials=5):
    p = Problem(m)
    fns, ok = {}, []
    for c in sweep_candidates(which, m):
        try:
            verify_cfg(p, which, c)
        except Exception as e:  # a broken config is reported and skipped
            log(f"  sweep {which} M={m} {c.key()}: FAILED {type(e).__name__}: {str(e)[:200]}")
            continue
        ok.append(c)
        fns[c.key()] = p.single(which, c)
    fns["torch"] = p.single(which, use_torch=True)
    t = time_graph(fns, iters=iters, trials=trials)
    best = min((c for c in ok), key=lambda c: t[c.key()])
    del p
    torch.cuda.empty_cache()
    return best, t


# --------------------------------------------------------------------------------------
SWEEP_PLAN = [("qkvg", 8), ("qkvg", 16), ("packed", 8), ("packed", 16), ("fb", 8), ("fb", 16)]
SWEEP_PLAN += [("fab", m) for m in (1, 2, 4, 8, 16)]


def needed_configs():
    """Every (config, N, K) this script may launch (for a CPU-side disk-cache warm-up)."""
    need = set()
    for m in range(1, 17):
        for which in ("qkvg", "packed", "fab", "fb"):
            n, k = shape_of(which)
            need.add((ec.default_config(m, n, k), n, k))
    for which, m in SWEEP_PLAN:
        n, k = shape_of(which)
        for c in sweep_candidates(which, m):
            need.add((c, n, k))
            if c.kind == "split_n":  # picked configs are re-tiled for every M of the bucket
                for mt in (1, 2, 4, 8, 16):
                    c2 = Config.from_dict({**c.to_dict(), "m_tile": mt})
                    if c2.check(mt, n, k) is None:
                        need.add((c2, n, k))
    need.add((ec.default_config(8, NQ, H), 8 * NQ, H))
    return sorted(need, key=lambda t: (t[0].key(), t[1], t[2]))


def fused_candidates(m):
    mt = 8 if m <= 8 else 16
    out = []
    combos = ((2, 8, 4), (2, 8, 7), (4, 8, 2), (2, 16, 2), (1, 16, 2), (2, 4, 8), (1, 8, 4),
              (4, 4, 4)) if m <= 8 else ((2, 8, 4), (1, 8, 4), (2, 16, 2))
    for t, wk, u in combos:
        fb = max(1, 16 // wk)
        c = Config("fused", m_tile=mt, tiles=t, warps_k=wk, unroll=u, fb_tiles=fb)
        if ec.check_fused(c, m, NP, H, NQ, NFB, NFA) is None:
            out.append(c)
    return out


def needed_fused():
    need = {ec.default_fused_config(m, NP, H, NFA, NQ, swap) for m in range(1, 17) for swap in (False, True)}
    for m in (8, 16):
        need.update(fused_candidates(m))
    return sorted(need, key=lambda c: c.key())


# ---- variant sweep: settings off the defaults, timed next to them ----
# What each earlier sweep tried and measured is in the results ledger (the KDA kernel records);
# these tables hold only the variants still timed.
VSWEEP_MS = (1, 4, 8, 9, 12, 16)
_SWAPPED = dict(prefetch_producer_weights=True, tagged_handoff=True, interleave_k=True, weights_as_a=True,
                weight_layout=2, min_blocks_per_sm=3)
VSWEEP_FUSED = [  # (tiles, warps_k, unroll, fb_tiles, fb_passes, extra; only_mt: that m_tile only)
    (2, 8, 4, 2, 1, {**_SWAPPED, "prefetch_fb_l2": 3, "only_mt": 8}),
    (2, 8, 4, 2, 1, {**_SWAPPED, "only_mt": 16}),
    (2, 8, 4, 2, 1, {**_SWAPPED, "g1_stores": 1, "only_mt": 16}),
    (2, 8, 4, 2, 1, {**_SWAPPED, "prefetch_fb_l2": 3, "g1_stores": 1, "only_mt": 8}),
    (2, 8, 4, 2, 1, {**_SWAPPED, "g1_stores": 1, "prologue_k_steps": 3, "only_mt": 16}),
]
VSWEEP_STREAM = [  # (tiles, warps_k, unroll, extra)
    (2, 8, 4, {"interleave_k": True}),
]
VSWEEP_E = [  # two launches: (extra for the default stream config, extra for the default F_B config)
    ({}, {}), ({"interleave_k": True}, {}),
]


def vsweep_e(m):
    """[(label, stream config, F_B config)] for the two-launch path."""
    out = []
    for se, fe in VSWEEP_E:
        cs = dataclasses.replace(ec.default_config(m, NP, H), **se)
        cb = dataclasses.replace(ec.default_config(m, NFB, NFA), **fe)
        if cs.check(m, NP, H) is None and cb.check(m, NFB, NFA) is None:
            out.append((f"e[{cs.key()} + {cb.key()}]", cs, cb))
    return out


def vsweep_fused(m):
    mt = 8 if m <= 8 else 16
    out = []
    for t, wk, u, fb, fp, extra in VSWEEP_FUSED:
        extra = dict(extra)
        if extra.pop("only_mt", mt) != mt:
            continue
        c = Config("fused", m_tile=extra.pop("force_mt", mt), tiles=t, warps_k=wk, unroll=u, fb_tiles=fb, fb_passes=fp, **extra)
        if ec.check_fused(c, m, NP, H, NQ, NFB, NFA) is None:
            out.append(c)
    return out


def vsweep_stream(m):
    mt = 8 if m <= 8 else 16
    out = [Config("stream", m_tile=mt, tiles=t, warps_k=wk, unroll=u, **extra) for t, wk, u, extra in VSWEEP_STREAM]
    out = list(dict.fromkeys(out))
    return [c for c in out if c.check(m, NP, H) is None]


def variant_sweep(out_dir, floor_us, t0, ms=VSWEEP_MS):
    res = {}
    for m in ms:
        p = Problem(m)
        fcands, scands = vsweep_fused(m), vsweep_stream(m)
        # correctness of every candidate first (poisoned outputs, fp32 reference)
        for c in fcands:
            p.y[0].fill_(float("nan"))
            p.g1[0].fill_(float("nan"))
            p.make_fused(c)(0)
            torch.cuda.synchronize()
            ref = p.x.float() @ p.wp[0].float().t()
            check(p.y[0], ref, f"vsweep {c.key()} M={m} out")
            check(p.g1[0], ref[:, NQ:NQ + NFA] @ p.wfb[0].float().t(), f"vsweep {c.key()} M={m} g1")
        for c in scands:
            verify_cfg(p, "packed", c)
        for label, cs, cb in vsweep_e(m):
            p.y[0].fill_(float("nan"))
            p.g1[0].fill_(float("nan"))
            p.make_packed_cute(cs, cb)(0)
            torch.cuda.synchronize()
            ref = p.x.float() @ p.wp[0].float().t()
            check(p.y[0], ref, f"vsweep {label} M={m} out")
            check(p.g1[0], p.y[0][:, NQ:NQ + NFA].float() @ p.wfb[0].float().t(), f"vsweep {label} M={m} g1")
        fns = {c.key(): p.make_fused(c) for c in fcands}
        fns.update({"alone_" + c.key(): p.single("packed", c) for c in scands})
        fns["e_packed_default"] = p.make_packed_cute(ec.default_config(m, NP, H),
                                                     ec.default_config(m, NFB, NFA))
        for label, cs, cb in vsweep_e(m):
            fns[label] = p.make_packed_cute(cs, cb)
        fns["f_fused_default"] = p.make_fused(None)
        t = time_graph(fns, iters=20, trials=7)
        res[m] = {k: round(v, 2) for k, v in t.items()}
        top = sorted(t.items(), key=lambda kv: kv[1])
        log(f"vsweep M={m}: " + "  ".join(f"{k} {v:.2f}" for k, v in top) + f"  [{time.time() - t0:.0f}s]")
        del p
        torch.cuda.empty_cache()
    names = sorted({k for r in res.values() for k in r},
                   key=lambda k: (res.get(16, {}).get(k, 1e9), res.get(8, {}).get(k, 1e9)))
    lines = [f"floor {floor_us:.2f} us; us per step (CUDA-graph replay, 20 steps, 4 weight sets, median of 7)",
             "", "| config | " + " | ".join(f"M={m}" for m in ms) + " |",
             "|---|" + "---:|" * len(ms)]
    for k in names:
        lines.append(f"| {k} | " + " | ".join(f"{res[m][k]:.2f}" if k in res[m] else "-" for m in ms) + " |")
    (out_dir / "variant_sweep.md").write_text("\n".join(lines) + "\n")
    log("\n".join(lines))
    return res


def precompile(arch="sm_90a", sweep=True):
    """Compile everything into the disk cache without a GPU (carry it to the GPU machine)."""
    need = needed_configs() if sweep else sorted(
        {(ec.default_config(m, n, k), n, k) for m in range(1, 17)
         for n, k in (shape_of(w) for w in ("qkvg", "packed", "fab", "fb"))}
        | {(ec.default_config(8, NQ, H), 8 * NQ, H)}, key=lambda t: (t[0].key(), t[1], t[2]))
    t0 = time.time()
    for i, (c, n, k) in enumerate(need):
        ec.get_kernel(c, n, k, arch=arch)
        if i % 20 == 0:
            log(f"precompiled {i + 1}/{len(need)} [{time.time() - t0:.0f}s]")
    fused = needed_fused()
    if VARIANT_PRECOMPILE:
        fused = sorted(set(fused) | {c for m in (8, 16) for c in vsweep_fused(m)}, key=lambda c: c.key())
        for c in sorted({c for m in (8, 16) for c in vsweep_stream(m)}, key=lambda c: c.key()):
            ec.get_kernel(c, NP, H, arch=arch)
        for m in (1, 8, 9, 16):
            for _, cs, cb in vsweep_e(m):
                ec.get_kernel(cs, NP, H, arch=arch)
                ec.get_kernel(cb, NFB, NFA, arch=arch)
    for c in fused:
        ec.get_fused_kernel(c, NP, H, NQ, NFB, NFA, arch=arch)
    log(f"precompiled {len(need)} + {len(fused)} fused kernels into {ec.cache_dir()} "
        f"in {time.time() - t0:.0f}s")


VARIANT_PRECOMPILE = False


def profile_once(specs):
    """Launch each (M, config-or-None) twice (for an external profiler such as ncu);
    None = the packed stream default + F_B (two launches)."""
    for m, c in specs:
        p = Problem(m)
        for _ in range(2):
            if c is None:
                p.make_packed_cute(ec.default_config(m, NP, H), ec.default_config(m, NFB, NFA))(0)
            elif c.kind == "stream":
                p.single("packed", c)(0)
            else:
                p.make_fused(c)(0)
        torch.cuda.synchronize()
        log(f"profiled M={m} {c.key() if c else 'packed default + F_B'}")
        del p


def main():
    global VARIANT_PRECOMPILE
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "results/kda_kernels"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sanitize", action="store_true", help="small correctness run only")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--precompile", action="store_true", help="fill the disk cache, no GPU")
    ap.add_argument("--fused-sweep", action="store_true", help="time fused configs at M=8, 16")
    ap.add_argument("--profile-once", default="",
                    help="M:fused-config-json;... launched twice each, for ncu (no timing)")
    ap.add_argument("--variant-sweep", action="store_true",
                    help="time the prefetch/tile/launch-attribute variants at M=1,4,8,9,12,16 only")
    ap.add_argument("--ms", default="", help="variant sweep: comma-separated M values instead")
    args = ap.parse_args()
    VARIANT_PRECOMPILE = args.variant_sweep
    if args.precompile:
        precompile(sweep=not args.no_sweep)
        return
    assert ec.available(), "needs a cc>=9.0 GPU and cutlass"
    if args.profile_once:
        specs = []
        for item in args.profile_once.split(";"):
            m, _, js = item.partition(":")
            specs.append((int(m), Config.from_dict(json.loads(js)) if js.strip() else None))
        profile_once(specs)
        return
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    t0 = time.time()
    if args.sanitize:
        w = correctness([1, 3, 9, 16], graph=False)
        log("sanitize-run correctness:", json.dumps(w))
        return
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "device": dev, "torch": torch.__version__,
              "cutlass_dsl": ec._cutlass_version(), "weight_bytes": WEIGHT_BYTES}

    log(f"== {dev}  torch {torch.__version__}  cutlass-dsl {ec._cutlass_version()}")
    if args.variant_sweep:  # its own per-candidate correctness checks, then timing only
        bw = read_bandwidth()
        floor_us = WEIGHT_BYTES / (max(bw.values()) * 1e12) * 1e6
        report.update(bandwidth=bw, floor_us=floor_us)
        log(f"read bandwidth {json.dumps({k: round(v, 3) for k, v in bw.items()})} TB/s -> floor {floor_us:.2f} us")
        ms = tuple(int(v) for v in args.ms.split(",") if v.strip()) or VSWEEP_MS
        report["variant_sweep"] = variant_sweep(out_dir, floor_us, t0, ms)
        (out_dir / "variant_sweep.json").write_text(json.dumps(report, indent=1, default=str))
        return
    worst = correctness(list(range(1, 17)))
    report["correctness_worst_cos_rel"] = worst
    log("correctness M=1..16 (incl. graph on side stream) OK, worst: "
        + ", ".join(f"{k}: cos {v[0]:.5f} rel {v[1]:.1e}" for k, v in worst.items()))
    log(f"[{time.time() - t0:.0f}s]")

    bw = read_bandwidth()
    report["bandwidth"] = bw
    bw_best = max(bw.values())
    floor_us = WEIGHT_BYTES / (bw_best * 1e12) * 1e6
    report["floor_us"] = floor_us
    log(f"read bandwidth: {json.dumps({k: round(v, 3) for k, v in bw.items()})} TB/s -> "
        f"floor {floor_us:.2f} us for {WEIGHT_BYTES / 1e6:.1f} MB")

    # ---- config sweep per M bucket ----------------------------------------------------
    best = {}  # (which, bucket) -> Config
    sweep_log = {}
    if not args.no_sweep:
        plan = list(SWEEP_PLAN)
        if args.quick:
            plan = [("qkvg", 8), ("fab", 8), ("fb", 8)]
        for which, m in plan:
            b, t = sweep(which, m)
            best[(which, m)] = b
            sweep_log[f"{which}_M{m}"] = {"best": b.key(), "best_cfg": b.to_dict(),
                                          "us": {k: round(v, 2) for k, v in t.items()}}
            top = sorted(t.items(), key=lambda kv: kv[1])[:4]
            log(f"sweep {which:6s} M={m:2d}: " + "  ".join(f"{k} {v:.2f}" for k, v in top)
                + f"  | torch {t['torch']:.2f}  [{time.time() - t0:.0f}s]")
    report["sweep"] = sweep_log
    fused_best = {}
    if args.fused_sweep:
        for m in (8, 16):
            p = Problem(m)
            cands = fused_candidates(m)
            fns = {c.key(): p.make_fused(c) for c in cands}
            fns["e_packed_default"] = p.make_packed_cute(ec.default_config(m, NP, H),
                                                         ec.default_config(m, NFB, NFA))
            t = time_graph(fns, iters=20, trials=5)
            b = min(cands, key=lambda c: t[c.key()])
            fused_best[8 if m <= 8 else 16] = b
            sweep_log[f"fused_M{m}"] = {"best": b.key(), "best_cfg": b.to_dict(),
                                        "us": {k: round(v, 2) for k, v in t.items()}}
            log(f"fused sweep M={m}: " + "  ".join(f"{k} {v:.2f}" for k, v in sorted(t.items(), key=lambda kv: kv[1]))
                + f"  [{time.time() - t0:.0f}s]")
            del p
            torch.cuda.empty_cache()

    def pick(which, m):
        if which == "fab":
            bucket = 1 << (m - 1).bit_length()
        else:
            bucket = 8 if m <= 8 else 16
        c = best.get((which, bucket))
        n, k = shape_of(which)
        if c is None:
            return ec.default_config(m, n, k)
        if c.kind == "split_n":
            c = Config.from_dict({**c.to_dict(), "m_tile": 1 << (m - 1).bit_length()})
        return c

    # ---- main table -----------------------------------------------------------------
    rows = []
    ms = [1, 2, 4, 8, 12, 16] if args.quick else list(range(1, 17))
    for m in ms:
        p = Problem(m)
        cq, cab, cb, cp = pick("qkvg", m), pick("fab", m), pick("fb", m), pick("packed", m)
        # (f) = kda_fused_step as shipped (one fused kernel wherever fused_is_default, else
        # the two-launch path), with the fused sweep's pick forced for M <= 8
        shipped = ec.fused_is_default(ec.default_fused_config(m, NP, H, NFA, NQ), m)
        cf = fused_best.get(8) if m <= 8 else None
        fns = {
            "a_seq_torch": p.seq_torch,
            "b_2s_torch": p.two_torch,
            "c_2s_cute": p.make_two_cute(cq, cab, cb),
            "e_packed_cute": p.make_packed_cute(cp, cb),
            "f_fused_cute": p.make_fused(cf),
            "packed_cute_alone": p.single("packed", cp),
            "qkvg_cute": p.single("qkvg", cq),
            "qkvg_torch": p.single("qkvg", use_torch=True),
            "fab_cute": p.single("fab", cab),
            "fab_torch": p.single("fab", use_torch=True),
            "fb_cute": p.single("fb", cb),
            "fb_torch": p.single("fb", use_torch=True),
        }
        t = time_graph(fns, iters=20, trials=7)
        best_cute = min(t["c_2s_cute"], t["e_packed_cute"], t["f_fused_cute"])
        row = {"M": m, **{k: round(v, 2) for k, v in t.items()},
               "best_cute": round(best_cute, 2), "floor": round(floor_us, 2),
               "best_over_floor": round(best_cute / floor_us, 3),
               "speedup_vs_a": round(t["a_seq_torch"] / best_cute, 3),
               "speedup_vs_b": round(t["b_2s_torch"] / best_cute, 3),
               "f_over_floor": round(t["f_fused_cute"] / floor_us, 3),
               "f_vs_a": round(t["a_seq_torch"] / t["f_fused_cute"], 3),
               "f_vs_b": round(t["b_2s_torch"] / t["f_fused_cute"], 3),
               "configs": {"qkvg": cq.key(), "fab": cab.key(), "fb": cb.key(), "packed": cp.key(),
                           "fused": cf.key() if cf else ("fused default" if shipped
                                                         else "two-launch fallback")}}
        rows.append(row)
        log(f"M={m:2d} a {t['a_seq_torch']:6.2f} b {t['b_2s_torch']:6.2f} c {t['c_2s_cute']:6.2f} "
            f"e {t['e_packed_cute']:6.2f} f {t['f_fused_cute']:6.2f} "
            f"(packed alone {t['packed_cute_alone']:.2f}) | qkvg {t['qkvg_cute']:.2f}/{t['qkvg_torch']:.2f} "
            f"fab {t['fab_cute']:.2f}/{t['fab_torch']:.2f} fb {t['fb_cute']:.2f}/{t['fb_torch']:.2f}"
            f"  [{time.time() - t0:.0f}s]")
        del p
        torch.cuda.empty_cache()
    # the floor uses the higher of a read-bandwidth measurement before and one after the
    # timings (a 2 GiB sum moved 3.86 -> 4.17 TB/s between runs minutes apart, session 5)
    bw_end = read_bandwidth()
    report["bandwidth_end"] = bw_end
    log(f"read bandwidth at the end: {json.dumps({k: round(v, 3) for k, v in bw_end.items()})} TB/s")
    bw_best = max(bw_best, *bw_end.values())
    floor_us = WEIGHT_BYTES / (bw_best * 1e12) * 1e6
    report["floor_us"] = floor_us
    for r in rows:
        r["floor"] = round(floor_us, 2)
        r["best_over_floor"] = round(r["best_cute"] / floor_us, 3)
        r["f_over_floor"] = round(r["f_fused_cute"] / floor_us, 3)
    report["rows"] = rows

    lines = [f"# KDA decode projections, {dev}, {report['date']}",
             f"torch {torch.__version__}, nvidia-cutlass-dsl {report['cutlass_dsl']}; "
             f"read bandwidth {bw_best:.3f} TB/s (before: {'; '.join(f'{k} {v:.3f}' for k, v in bw.items())}; "
             f"after: {'; '.join(f'{k} {v:.3f}' for k, v in bw_end.items())}); "
             f"floor = {WEIGHT_BYTES / 1e6:.2f} MB / bw = {floor_us:.2f} us",
             "CUDA-graph replay, 20 steps per graph, 4 rotated weight sets, median of 7 trials; us per step.",
             "best = min(c, e, f). Targets: best <= 1.10x floor (M<=8), <= 1.20x (M<=16), >= 1.25x vs a, >= 1.0x vs b.",
             "",
             "| M | (a) seq torch | (b) 2-stream torch | (c) 2-stream cute | (e) packed cute | (f) fused cute | floor | best/floor | vs (a) | vs (b) | packed kernel alone | QKVG cute/torch | F_A cute/torch | F_B cute/torch |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['M']} | {r['a_seq_torch']:.2f} | {r['b_2s_torch']:.2f} | {r['c_2s_cute']:.2f} | "
                     f"{r['e_packed_cute']:.2f} | {r['f_fused_cute']:.2f} | {r['floor']:.2f} | "
                     f"{r['best_over_floor']:.3f} | {r['speedup_vs_a']:.3f} | {r['speedup_vs_b']:.3f} | "
                     f"{r['packed_cute_alone']:.2f} | "
                     f"{r['qkvg_cute']:.2f}/{r['qkvg_torch']:.2f} | {r['fab_cute']:.2f}/{r['fab_torch']:.2f} | "
                     f"{r['fb_cute']:.2f}/{r['fb_torch']:.2f} |")
    table = "\n".join(lines)
    (out_dir / "kda_bench.md").write_text(table + "\n")
    (out_dir / "kda_bench.json").write_text(json.dumps(report, indent=1, default=str))
    log(table)
    log(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
