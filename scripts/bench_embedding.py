#!/usr/bin/env python3
"""The KDA executor embedded in a model on one GPU: compiled and captured vs the bare executor,
weight memory, and shipped tuning vs the tuning file.

Per M (decode tokens, 1..16), us per KDA layer step, 4 weight sets rotated (4 layers called in
one forward, one weight set each; the L2 is 60 MB, one layer's weights 90 MB):
  bare       4 executors (build_executor, no tuning argument) called in one torch.cuda.graph
  ro         the same 4-layer nn.Module, torch.compile(mode="reduce-overhead", fullgraph=True),
             one static-shape compile per M: CUDA graph trees replay it, x copied into the
             graph's static input every call (x is a fresh input of the compiled function)
  ro_static  the same with x marked a static address (torch._dynamo.mark_static_address), as
             when x comes from the engine's static buffers: no input copy
  pw_piece   a vLLM-style piecewise layout: the compiled module split in two FX pieces
             (a pre-op; the 4 executor ops), each captured in its own CUDA graph: the piece
             holding the ops, replayed alone
  pw_all     both pieces (input copy, pre-op, ops)
  bare_deep, ro_deep
             bare and ro_static with --depth layer calls per forward (the 4 weight sets in turn,
             each executor called depth / 4 times), as deep as a real decode forward: CUDA graph
             trees' fixed cost per replay (the stream hand-offs around the graph, outside it)
             spread over the layers the way a model spreads it
  prev       today's main build emulated: the same fused kernel (executors.cute.kda_fused_step)
             reading a second, tiled copy of w_packed (the prepack copy), 4 sets in one graph
  file       4 executors built with tuning=results/tuning/2026-11-30_h200_k3_kda_projection_s8.json
  defaults   4 executors built with tuning={} (the plan's defaults: two_branch at M <= 2)
  floor      weight bytes (6288x7168 + 1536x128, bf16) / HBM read bandwidth measured here
Targets: ro_deep/bare_deep and pw_piece/bare <= 1.02 (ro_static/bare and ro/bare show the
4-layer forward, where the trees' fixed cost per replay weighs 8x more; ro the input copy's cost); bare/floor within 2 % of prev/floor; bare (no tuning
argument) within 1 % of file. Memory: torch.cuda.memory_allocated() after building --layers
executors (weights prepared in place) minus the weights' bytes <= 1 % of the weights.

Correctness first, per path and M: fresh random x, outputs NaN-poisoned before the replay
(graph paths) or overwritten by a second call (reduce-overhead), against fp32 references
(cosine > 0.999, rel < 1e-2; g1's reference uses the bf16-rounded f_a). Timing: per call, a
spin kernel of --spin-cycles first (2 ms: longer than any path's host cost, so the GPU times
the captured work alone), CUDA events around one call (4 steps), median of --trials, paths in a
new random order every trial. The host's cost of issuing one call (from an idle GPU, Dynamo's
guards and CUDA graph trees' bookkeeping included) is timed separately per path (*_host_us):
it is paid once per forward, whatever the number of layers the graph holds.

    python scripts/bench_embedding.py --out results/embedding
    python scripts/bench_embedding.py --dry-run          # CPU, small shapes, no graphs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

from executors import build_executor
from executors.tools.bench import env_info, log, parse_tokens, write_report
from executors.tools.check import compile_for_run
from executors.tools.timing import call_times, hbm_bandwidth, host_times
from executors.weights import prepare_weights
from planner.lang.loader import load_plan

ROOT = Path(__file__).resolve().parent.parent

KDA = ROOT / "plans" / "k3_kda_projection.yaml"
TUNING = ROOT / "results" / "tuning" / "2026-11-30_h200_k3_kda_projection_s8.json"
SMALL = {"hidden": 256, "kda_heads": 64, "head_dim": 16, "fa_rank": 32, "fab_pad": 8}
NSETS = 4
OUTS = ("mixed_qkv", "g_proj", "g1", "beta")


def weight_sets(plan, dev, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        out.append({k: (torch.randn(plan.tensors[k].shape, generator=g) / plan.tensors[k].shape[1] ** 0.5)
                    .bfloat16().to(dev) for k in plan.weights})
    return out


class Layers(nn.Module):
    """One forward = one KDA step per executor (weight set), all on the same x."""

    def __init__(self, exs, pre: bool = False):
        super().__init__()
        self.exs, self.pre = exs, pre

    def forward(self, x):
        if self.pre:  # the piece before the ops in the piecewise layout
            x = x * 1.0
        outs = []
        for ex in self.exs:
            o = ex(x=x)
            outs += [o[k] for k in OUTS]
        return tuple(outs)


def reference(plan, w, x):
    p = plan.params
    hc, fa, lh = p["head_cols"], p["fa_rank"], p["local_heads"]
    proj = x.float() @ w["w_packed"].float().t()
    f_a = proj[:, 4 * hc:4 * hc + fa].bfloat16().float()
    return [proj[:, :3 * hc], proj[:, 3 * hc:4 * hc], f_a @ w["w_fb"].float().t(), proj[:, 4 * hc + fa:4 * hc + fa + lh]]


def check(outs, refs) -> str | None:
    for i, (a, r) in enumerate(zip(outs, refs, strict=True)):
        a = a.float()
        if a.shape != r.shape or not bool(torch.isfinite(a).all()):
            return f"output {i}: shape {tuple(a.shape)} vs {tuple(r.shape)} or not finite"
        cos = float(torch.nn.functional.cosine_similarity(a.flatten(), r.flatten(), dim=0))
        rel = float((a - r).norm() / r.norm().clamp_min(1e-30))
        if cos < 0.999 or rel > 1e-2:
            return f"output {i}: cos {cos:.5f} rel {rel:.3g}"
    return None


# ------------------------------------------------------------------ captured paths

def capture(fn, *args):
    """Warm up on a side stream, capture fn(*args) in a CUDA graph; (graph, static outputs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # capture_error_mode "global", as torch.cuda.graph and vLLM use
        out = fn(*args)
    return g, out


class Piece:
    """One FX piece captured per input signature; inputs at the captured addresses are not copied."""

    def __init__(self, gm, cuda: bool):
        self.gm, self.cuda, self.graphs, self.last = gm, cuda, {}, None

    def __call__(self, *args):
        if not self.cuda:
            return self.gm(*args)
        key = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)
        e = self.graphs.get(key)
        if e is None:
            static = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            g, out = capture(self.gm, *static)
            e = self.graphs[key] = (g, static, out)
        g, static, out = e
        self.last = e
        for a, s in zip(args, static, strict=True):
            if isinstance(a, torch.Tensor) and a.data_ptr() != s.data_ptr():
                s.copy_(a)
        g.replay()
        return out


class Piecewise:
    """A torch.compile backend: split the graph before the first planner op, capture each piece."""

    def __init__(self, cuda: bool):
        self.cuda, self.pieces = cuda, []

    def __call__(self, gm, example_inputs):
        from torch.fx.passes.split_module import split_module
        part, state = {}, {"seen": False}
        for node in gm.graph.nodes:
            if node.op == "call_function" and "planner." in str(node.target):
                state["seen"] = True
            part[node] = 1 if state["seen"] else 0
        split = split_module(gm, None, lambda n: part[n], keep_original_order=True)
        for name, mod in list(split.named_children()):
            piece = Piece(mod, self.cuda)
            self.pieces.append(piece)
            split._modules[name] = _Call(piece)
        return split


class _Call(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


# ------------------------------------------------------------------ timing

def memory_section(plan, dev, layers: int) -> dict:
    # per-process state first (cuBLAS handle and its workspace come from the caching allocator
    # once per process and stream, not per executor)
    torch.cuda.current_blas_handle()
    torch.mm(torch.ones(8, 8, device=dev), torch.ones(8, 8, device=dev))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    ws = weight_sets(plan, dev, layers, seed=7)
    wbytes = torch.cuda.memory_allocated() - base
    exs = []
    for w in ws:
        cp = compile_for_run(plan)
        exs.append(build_executor(cp, prepare_weights(cp, w, dev, inplace=True), device=dev))
    torch.cuda.synchronize()
    extra = torch.cuda.memory_allocated() - base - wbytes
    res = {"layers": layers, "weight_bytes": wbytes, "extra_bytes": extra, "extra_over_weights": extra / wbytes,
           "layouts": exs[0].weight_layouts, "prepacked_bytes": exs[0].prepacked_bytes}
    del exs, ws
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1..16")
    ap.add_argument("--layers", type=int, default=8, help="KDA executors built for the memory check")
    ap.add_argument("--trials", type=int, default=41)
    ap.add_argument("--depth", type=int, default=32, help="layer calls per forward of the deep paths (multiple of 4)")
    ap.add_argument("--spin-cycles", type=int, default=4_000_000,
                    help="GPU spin queued ahead of each timed call (default about 2 ms)")
    ap.add_argument("--out", default=None, help="directory for the .json/.md/.csv report")
    ap.add_argument("--stem", default=None, help="report file name stem (default: <date>_<device>_embedding)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, small shapes, no graphs")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.dry_run
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    plan = load_plan(KDA, {} if cuda else SMALL)
    tokens = parse_tokens(args.tokens, list(range(1, 17)))
    meta = env_info()
    if cuda:
        meta["memory"] = mem = memory_section(plan, dev, args.layers)
        log(f"[mem] {args.layers} layers: weights {mem['weight_bytes'] / 1e6:.1f} MB, extra after build"
            f" {mem['extra_bytes'] / 1e6:.3f} MB = {100 * mem['extra_over_weights']:.3f} % (target <= 1 %);"
            f" layouts {mem['layouts']}")
    ws = weight_sets(plan, dev, NSETS)
    build = lambda tuning, **kw: [build_executor(compile_for_run(plan), w, device=dev, tuning=tuning, **kw)  # noqa: E731
                                  for w in ws]
    bare = build(None)
    meta["tuning_source"] = bare[0].tuning_source
    meta["backends"] = bare[0].backends
    log(f"[tuning] no argument: {bare[0].tuning_source}")
    paths = {"bare": Layers(bare)}
    if TUNING.exists() and cuda:
        paths["file"] = Layers(build(str(TUNING)))
    paths["defaults"] = Layers(build({}))
    # reduce-overhead: one static-shape compile per M (CUDA graph trees record one graph each);
    # the piecewise layout: one dynamic compile (token dim unbacked), one captured graph per piece and M
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    ro_mode = "reduce-overhead" if cuda else "default"
    ro = torch.compile(Layers(bare), mode=ro_mode, fullgraph=True, dynamic=False)
    ro_static = torch.compile(Layers(bare), mode=ro_mode, fullgraph=True, dynamic=False)
    depth = max(NSETS, args.depth // NSETS * NSETS)
    deep = Layers(bare * (depth // NSETS))
    ro_deep = torch.compile(Layers(bare * (depth // NSETS)), mode=ro_mode, fullgraph=True, dynamic=False)
    pw_backend = Piecewise(cuda)
    pw = torch.compile(Layers(bare, pre=True), backend=pw_backend, fullgraph=True, dynamic=True)
    prev = None
    if cuda:
        from executors import cute
        nq = 4 * plan.params["head_cols"]
        swaps = [cute.tile_weights(w["w_packed"], 2) for w in ws]  # the copy today's build keeps

        def prev(x, outs):
            for w, sw, (o, g1) in zip(ws, swaps, outs, strict=True):
                cute.kda_fused_step(x, w["w_packed"], w["w_fb"], o, g1, fa_col=nq, w_swap=sw)
            return outs
    bw = hbm_bandwidth() if cuda else None
    wbytes = sum(t.numel() * t.element_size() for t in ws[0].values())
    rows, failures = [], []
    first = True
    for m in tokens:
        x = torch.randn(m, plan.params["hidden"], device=dev).bfloat16()
        x_pw = x.clone()  # marked for the dynamic piecewise compile only
        x_st = x.clone()
        torch._dynamo.mark_static_address(x_st)
        if first:
            torch._dynamo.decorators.mark_unbacked(x_pw, 0)
            first = False
        refs = [r for w in ws for r in reference(plan, w, x)]
        fns, row = {}, {"M": m}
        for name, mod in paths.items():
            if cuda:
                sx = x.clone()
                g, out = capture(mod, sx)
                for t in out:
                    t.fill_(float("nan"))
                g.replay()
                bad = check(out, refs)
                fns[name] = g.replay
            else:
                bad = check(mod(x), refs)
                fns[name] = lambda mod=mod, x=x: mod(x)
            row[f"{name}_variant"] = mod.exs[0].last_variants.get("kda_projection.0")
            if bad:
                failures.append(f"M={m} {name}: {bad}")
        deep_refs = refs * (depth // NSETS)
        if cuda:
            g_deep, out_deep = capture(deep, x_st.clone())
            for t_ in out_deep:
                t_.fill_(float("nan"))
            g_deep.replay()
            bad = check(out_deep, deep_refs)
            if bad:
                failures.append(f"M={m} bare_deep: {bad}")
            fns["bare_deep"] = g_deep.replay
        for name, f, xin in (("ro", ro, x), ("ro_static", ro_static, x_st), ("pw_all", pw, x_pw),
                             ("ro_deep", ro_deep, x_st)):
            for _ in range(2):  # warm-up / record runs of CUDA graph trees and the pieces
                out = f(xin)
            for t in out:
                t.fill_(float("nan"))
            out = f(xin)
            bad = check(out, deep_refs if name == "ro_deep" else refs)
            if bad:
                failures.append(f"M={m} {name}: {bad}")
            fns[name] = lambda f=f, x=xin: f(x)
        if cuda:
            fns["pw_piece"] = pw_backend.pieces[-1].last[0].replay  # the piece holding the ops, at this M
            outs = [(torch.empty(m, ws[0]["w_packed"].shape[0], device=dev, dtype=torch.bfloat16),
                     torch.empty(m, ws[0]["w_fb"].shape[0], device=dev, dtype=torch.bfloat16)) for _ in ws]
            sx = x.clone()
            g, out = capture(prev, sx, outs)
            for o, g1 in outs:
                o.fill_(float("nan"))
                g1.fill_(float("nan"))
            g.replay()
            hc, fa, lh = plan.params["head_cols"], plan.params["fa_rank"], plan.params["local_heads"]
            got = [t for o, g1 in outs for t in (o[:, :3 * hc], o[:, 3 * hc:4 * hc], g1, o[:, 4 * hc + fa:4 * hc + fa + lh])]
            bad = check(got, refs)
            if bad:
                failures.append(f"M={m} prev: {bad}")
            fns["prev"] = g.replay
        torch.cuda.synchronize() if cuda else None
        t = call_times(fns, args.trials, cuda, spin_cycles=args.spin_cycles)
        for n, us in t.items():
            row[f"{n}_us"] = round(us / (depth if n.endswith("_deep") else NSETS), 3)
        for n, us in host_times({k: fns[k] for k in ("bare", "ro", "ro_static", "pw_all", "ro_deep") if k in fns},
                                max(5, args.trials // 4), cuda).items():
            row[f"{n}_host_us"] = round(us, 1)  # per call (4 steps), not per step
        floor = wbytes / (bw["sum_read_TBps"] * 1e6) if bw else None
        row["floor_us"] = None if floor is None else round(floor, 3)
        b = row["bare_us"]
        row["ro_over_bare"] = round(row["ro_us"] / b, 4)
        row["ro_static_over_bare"] = round(row["ro_static_us"] / b, 4)
        if "bare_deep_us" in row:
            row["ro_deep_over_bare_deep"] = round(row["ro_deep_us"] / row["bare_deep_us"], 4)
            # the trees' cost per replay, from both depths: (ro - bare) per forward
            row["ro_fixed_us"] = round(NSETS * (row["ro_static_us"] - b), 2)
            row["ro_fixed_deep_us"] = round(depth * (row["ro_deep_us"] - row["bare_deep_us"]), 2)
        row["pw_all_over_bare"] = round(row["pw_all_us"] / b, 4)
        if "pw_piece_us" in row:
            row["pw_piece_over_bare"] = round(row["pw_piece_us"] / b, 4)
        if floor:
            row["bare_over_floor"] = round(b / floor, 4)
            row["prev_over_floor"] = round(row["prev_us"] / floor, 4)
            row["bare_over_prev"] = round(b / row["prev_us"], 4)
        if "file_us" in row:
            row["bare_over_file"] = round(b / row["file_us"], 4)
        row["defaults_over_bare"] = round(row["defaults_us"] / b, 4)
        log(f"[M={m}] " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "M"))
        rows.append(row)
    meta["failures"] = failures
    cols = [("M", "M", ""), ("bare_us", "bare", ".2f"), ("bare_deep_us", f"bare x{depth}", ".2f"),
            ("ro_deep_us", f"ro x{depth}", ".2f"), ("ro_deep_over_bare_deep", f"ro/bare x{depth} (<=1.02)", ".3f"),
            ("ro_fixed_us", "ro fixed us/forward (4)", ".2f"), ("ro_fixed_deep_us", f"ro fixed us/forward ({depth})", ".2f"),
            ("ro_static_us", "ro static", ".2f"),
            ("ro_static_over_bare", "ro static/bare", ".3f"), ("ro_us", "ro", ".2f"),
            ("ro_over_bare", "ro/bare", ".3f"),
            ("pw_piece_us", "pw piece", ".2f"), ("pw_piece_over_bare", "piece/bare (<=1.02)", ".3f"),
            ("pw_all_us", "pw all", ".2f"), ("prev_us", "prev", ".2f"), ("floor_us", "floor", ".2f"),
            ("bare_over_floor", "bare/floor", ".3f"), ("prev_over_floor", "prev/floor", ".3f"),
            ("bare_over_prev", "bare/prev (<=1.02)", ".3f"), ("file_us", "file", ".2f"),
            ("bare_over_file", "bare/file (<=1.01)", ".3f"), ("defaults_us", "defaults", ".2f"),
            ("bare_variant", "variant", ""), ("defaults_variant", "defaults variant", ""),
            ("bare_host_us", "host: bare", ".1f"), ("ro_static_host_us", "host: ro static", ".1f"),
            ("ro_host_us", "host: ro", ".1f"), ("pw_all_host_us", "host: pw all", ".1f")]
    notes = ["us per KDA layer step (one call runs 4 steps, one per weight set), GPU time behind a"
             f" {args.spin_cycles}-cycle spin; host: us to issue one whole call (4 steps) from an idle GPU.",
             f"tuning with no argument: {meta['tuning_source']}"]
    if "memory" in meta:
        mm = meta["memory"]
        notes.append(f"memory: {mm['layers']} layers, weights {mm['weight_bytes'] / 1e6:.1f} MB, extra after build"
                     f" {mm['extra_bytes'] / 1e6:.3f} MB ({100 * mm['extra_over_weights']:.3f} %, target <= 1 %)")
    notes += [f"FAILED: {f}" for f in failures]
    stem = args.stem or f"{meta['date'][:10]}_{'h200' if cuda else 'cpu'}_embedding"
    text = write_report(args.out, stem, meta, rows, cols,
                        "KDA executor embedded: compiled and captured vs bare, weight memory, shipped tuning", notes)
    print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
