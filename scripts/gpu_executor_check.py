#!/usr/bin/env python3
"""GPU proof of the executor (H200): correctness in every mode, real overlap, overhead.

  1. KDA projection plan on one GPU, M in a few buckets: eager, captured per bucket
     (GraphedExecutor) and inside a caller's own torch.cuda.graph capture; each
     output compared with the unfused reference plan run eagerly (allclose, bf16).
  2. Overlap of the two-branch variant: (a) per-op CUDA-event times per stream from
     executor.trace() with the variant forced eagerly, (b) a torch.profiler trace of
     the captured graph's replay: kernel intervals per CUDA stream, and how much of
     the aux-stream kernel time overlaps main-stream kernels.
  3. Overhead: replay of the compiled plan's graph vs a hand-captured graph of the
     same torch ops (ratio, target <= 1.02), and eager dispatch cost per op (host us).
  4. SP tail plan on two GPUs over NCCL (full K3 shapes): eager, per bucket, inside a
     caller's capture, each equal (bit-exact) to the unfused plan; replay time of the
     packed gather vs the four separate gathers.

Prints a table; writes gpu_executor_check.json (+ the profiler trace and a timeline)
to $OUT when set. Run: python scripts/gpu_executor_check.py [--quick]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from executors import build_executor
from executors.cudagraph import GraphedExecutor
from executors.tools.check import compile_for_run, make_data, reference_compiled
from executors.tools.timing import replay_times
from planner.lang.loader import load_plan

ROOT = Path(__file__).resolve().parent.parent

KDA = ROOT / "plans" / "k3_kda_projection.yaml"
SP = ROOT / "plans" / "k3_sp_tail.yaml"
OUT = os.environ.get("OUT")
TUNING = {"kda_two_branch_max": 14}  # vLLM's tuned limit: two branches for M <= 14 under capture
if "--tuning" in sys.argv:  # a `planner tune` file: its limits replace vLLM's
    TUNING = json.loads(Path(sys.argv[sys.argv.index("--tuning") + 1]).read_text()).get("limits") or TUNING


def _close(a: dict, b: dict, exact=False) -> tuple[bool, float]:
    err, ok = 0.0, True
    for k in b:
        x, y = a[k].float(), b[k].float()
        err = max(err, float((x - y).abs().max()))
        ok &= bool(torch.equal(a[k], b[k])) if exact else bool(torch.allclose(x, y, rtol=2e-2, atol=2e-2))
    return ok, err


def _capture(fn, warmup=2):
    """Warm up on a side stream, then capture fn() in a fresh graph: (graph, static outputs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def _time_replay(graphs: dict, iters=300, trials=7) -> dict:
    """Median us per replay for each graph (20 warm replays, then `iters` timed); order alternates."""
    return replay_times(graphs, trials, replays=iters, warm=20, order="alternate")


def _overlap(intervals_a, intervals_b) -> float:
    tot = 0.0
    for a0, a1 in intervals_a:
        for b0, b1 in intervals_b:
            tot += max(0.0, min(a1, b1) - max(a0, b0))
    return tot


# ---------------------------------------------------------------- KDA, one GPU

def kda_section(quick: bool) -> dict:
    plan = load_plan(KDA)
    _, w = make_data(plan, {"num_tokens": 1}, seed=0, rank=0, device="cuda")
    ex = build_executor(compile_for_run(plan), w, device="cuda", backend_prefs=("torch",), tuning=TUNING)
    ref = build_executor(reference_compiled(load_plan(KDA)), w, device="cuda", backend_prefs=("torch",))
    graphed = GraphedExecutor(ex)
    rows = []
    for m in ([1, 8, 16] if quick else [1, 2, 3, 8, 12, 14, 16]):
        x = torch.randn(m, 7168, device="cuda").to(torch.bfloat16)
        want = ref(x=x)
        eager = ex(x=x)
        ok_e, err_e = _close(eager, want)
        v_e = ex.last_variants["kda_projection.0"]
        g_out = graphed(x=x)
        ok_g, err_g = _close(g_out, want)
        v_g = graphed.last_variants["kda_projection.0"]
        sx = x.clone()
        g, static = _capture(lambda sx=sx: ex(x=sx))
        v_c = ex.last_variants["kda_projection.0"]
        sx.copy_(torch.randn_like(sx, dtype=torch.float32).to(torch.bfloat16))
        g.replay()
        ok_c, err_c = _close(static, ref(x=sx))
        rows.append({"m": m, "eager": [v_e, ok_e, err_e], "bucket_graph": [v_g, graphed.last_bucket, ok_g, err_g],
                     "caller_capture": [v_c, ok_c, err_c]})
    return {"rows": rows, "ex": ex, "ref": ref, "weights": w}


def overlap_section(ex) -> dict:
    x = torch.randn(8, 7168, device="cuda").to(torch.bfloat16)
    # (a) eager, variant forced: CUDA events around every op on its stream
    f = ex.facts({"x": x}, capturing=True)
    for _ in range(3):
        ex(x=x, _facts=f)
    with ex.trace():
        ex(x=x, _facts=f)
    recs = ex.last_trace
    main = [(r["start_us"], r["end_us"]) for r in recs if r["stream"] == "main" and r["kind"] == "gemm"]
    aux = [(r["start_us"], r["end_us"]) for r in recs if r["stream"] != "main" and r["kind"] == "gemm"]
    ev = {"records": recs, "aux_us": sum(b - a for a, b in aux), "overlap_us": _overlap(aux, main)}
    if OUT:
        ev["timeline"] = []
        for ext in ("svg", "png"):
            try:
                from planner.viz.timeline import render_timeline
                ev["timeline"].append(str(render_timeline(recs, Path(OUT) / f"kda_two_branch_timeline.{ext}",
                                                          "KDA two-branch (M=8), eager, CUDA events per op")))
            except Exception as exc:  # noqa: BLE001 - a picture is a bonus, never a failure
                ev["timeline"].append(f"{ext}: {type(exc).__name__}: {exc}")
    # (b) the captured graph's replay under torch.profiler: kernels per CUDA stream
    sx = x.clone()
    g, _ = _capture(lambda: ex(x=sx))
    variant = ex.last_variants["kda_projection.0"]
    from torch.profiler import ProfilerActivity, profile
    trace_path = Path(OUT or "/tmp") / "kda_two_branch_replay_trace.json"
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            g.replay()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace_path))
    kernels = [e for e in json.loads(trace_path.read_text()).get("traceEvents", []) if e.get("cat") == "kernel"]
    by_stream: dict = {}
    for k in kernels:
        by_stream.setdefault(k.get("args", {}).get("stream", k.get("tid")), []).append((k["ts"], k["ts"] + k["dur"]))
    streams = sorted(by_stream, key=lambda s: -sum(b - a for a, b in by_stream[s]))
    pr = {"variant": variant, "streams": {str(s): len(v) for s, v in by_stream.items()}, "trace": str(trace_path)}
    if len(streams) >= 2:
        main_k, aux_k = by_stream[streams[0]], [iv for s in streams[1:] for iv in by_stream[s]]
        pr.update(aux_kernel_us=sum(b - a for a, b in aux_k), overlap_us=_overlap(aux_k, main_k))
    return {"events": {k: v for k, v in ev.items() if k != "records"}, "event_records": recs, "profiler": pr}


def overhead_section(ex, w) -> dict:
    out = {}
    for m, label in ((8, "two_branch"), (16, "packed")):
        x = torch.randn(m, 7168, device="cuda").to(torch.bfloat16)
        wp, wf = w["w_packed"], w["w_fb"]

        def hand_packed():
            proj = torch.mm(x, wp.t())
            q, g_, fa, beta, _ = torch.split(proj, [4608, 1536, 128, 12, 4], -1)
            return q, g_, torch.mm(fa, wf.t()), beta

        aux = torch.cuda.Stream()

        def hand_two_branch():
            cur = torch.cuda.current_stream()
            aux.wait_stream(cur)
            qkvg = torch.mm(x, wp[:6144].t())
            with torch.cuda.stream(aux):
                fab = torch.mm(x, wp[6144:].t())
                fa, beta, _ = torch.split(fab, [128, 12, 4], -1)
                g1 = torch.mm(fa, wf.t())
            cur.wait_stream(aux)
            q, g_ = torch.split(qkvg, [4608, 1536], -1)
            return q, g_, g1, beta

        hand = hand_two_branch if label == "two_branch" else hand_packed
        g_plan, _ = _capture(lambda: ex(x=x))
        assert ex.last_variants["kda_projection.0"] == label, ex.last_variants
        g_hand, _ = _capture(hand)
        t = _time_replay({"plan": g_plan, "hand": g_hand})
        # eager dispatch: host time per call, no sync inside the loop (the GPU queue absorbs it)
        n = 300
        ops = None
        res = {}
        for name, fn in (("plan", lambda: ex(x=x)), ("hand", hand_packed)):
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            res[name] = (time.perf_counter() - t0) / n * 1e6
            torch.cuda.synchronize()
        with ex.trace():
            ex(x=x)
        ops = len(ex.last_trace)
        out[label] = {"m": m, "replay_plan_us": t["plan"], "replay_hand_us": t["hand"],
                      "replay_ratio": t["plan"] / t["hand"], "eager_plan_us_per_call": res["plan"],
                      "eager_hand_us_per_call": res["hand"], "eager_ops_per_call": ops,
                      "eager_overhead_us_per_op": (res["plan"] - res["hand"]) / ops,
                      "eager_variant": ex.last_variants["kda_projection.0"]}
    return out


# ---------------------------------------------------------------- SP tail, two GPUs over NCCL

def _sp_rank(rank, world, quick):
    from executors.tools.check import run_check
    load = lambda: load_plan(SP, {"tp_size": world})  # noqa: E731
    rows = []
    for t in ([13, 1024] if quick else [8, 13, 256, 1000, 4096]):
        rep = run_check(load, rank=rank, num_tokens=t, seed=5, device=f"cuda:{rank}", backend_prefs=("torch",))
        rows.append({"mode": "eager", "num_tokens": t, "ok": rep["ok"],
                     "err": max(o["max_abs_err"] for o in rep["outputs"])})
    plan = load()
    dev = f"cuda:{rank}"
    ex = build_executor(compile_for_run(plan), {}, device=dev)
    ref = build_executor(reference_compiled(load()), {}, device=dev)
    graphed = GraphedExecutor(ex)
    times = {}
    for bk in ([16, 1024] if quick else [8, 64, 1024, 4096]):
        b = {"num_tokens": bk}
        ins, _ = make_data(plan, b, seed=bk, rank=rank, device=dev)
        want = ref(dims=b, **ins)
        got = graphed(dims=b, **ins)
        ok, err = _close(got, want, exact=True)
        rows.append({"mode": "bucket_graph", "num_tokens": bk, "ok": ok, "err": err})
        static = {k: v.clone() for k, v in ins.items()}
        g, sout = _capture(lambda: ex(dims=b, **static))
        g_ref, _ = _capture(lambda: ref(dims=b, **static))
        new, _ = make_data(plan, b, seed=bk + 1, rank=rank, device=dev)
        for k in static:
            static[k].copy_(new[k])
        g.replay()
        ok, err = _close(sout, ref(dims=b, **static), exact=True)
        rows.append({"mode": "caller_capture", "num_tokens": bk, "ok": ok, "err": err})
        torch.distributed.barrier()
        times[bk] = _time_replay({"packed": g, "separate": g_ref}, iters=100, trials=5)
    return {"rank": rank, "rows": rows, "times_us": times}


def sp_section(quick: bool) -> dict:
    from executors.tools.ranks import run_ranks
    if torch.cuda.device_count() < 2:
        return {"skipped": f"needs 2 GPUs, found {torch.cuda.device_count()}"}
    return {"ranks": run_ranks(_sp_rank, 2, quick, backend="nccl", timeout_s=580, coll_timeout_s=120)}


# ---------------------------------------------------------------- report

def main() -> int:
    quick = "--quick" in sys.argv
    if not torch.cuda.is_available():
        print("no CUDA device: this script is for the GPU machine")
        return 2
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    kda = kda_section(quick)
    result["kda"] = kda["rows"]
    result["overlap"] = overlap_section(kda["ex"])
    result["overhead"] = overhead_section(kda["ex"], kda["weights"])
    result["sp"] = sp_section(quick)
    ok = True
    print(f"{result['device']}  torch {result['torch']}")
    print("KDA projection (1 GPU)   M  | eager            | per-bucket graph         | caller capture")
    for r in result["kda"]:
        e, g, c = r["eager"], r["bucket_graph"], r["caller_capture"]
        ok &= e[1] and g[2] and c[1]
        print(f"  {r['m']:>24} | {e[0]:<10} {'ok' if e[1] else 'BAD'} | {g[0]:<10} b={g[1]:<3} {'ok' if g[2] else 'BAD'}"
              f"     | {c[0]:<10} {'ok' if c[1] else 'BAD'}  (max err {max(e[2], g[3], c[2]):.3g})")
    ov = result["overlap"]
    print(f"overlap, eager events: aux gemm {ov['events']['aux_us']:.1f} us, overlapped with main {ov['events']['overlap_us']:.1f} us")
    p = ov["profiler"]
    if "overlap_us" in p:
        print(f"overlap, graph replay profiler ({p['variant']}): aux kernels {p['aux_kernel_us']:.1f} us,"
              f" overlapped {p['overlap_us']:.1f} us over 10 replays; kernels per stream {p['streams']}")
    else:
        print(f"overlap, graph replay profiler: one stream only {p['streams']}")
    for label, o in result["overhead"].items():
        print(f"overhead {label:<10} M={o['m']}: replay plan {o['replay_plan_us']:.2f} us vs hand {o['replay_hand_us']:.2f} us"
              f" (ratio {o['replay_ratio']:.3f}); eager {o['eager_plan_us_per_call']:.1f} vs {o['eager_hand_us_per_call']:.1f}"
              f" us/call, {o['eager_overhead_us_per_op']:.2f} us/op over {o['eager_ops_per_call']} ops")
    sp = result["sp"]
    if "ranks" in sp:
        for rk in sp["ranks"]:
            for r in rk["rows"]:
                ok &= r["ok"]
            bad = [r for r in rk["rows"] if not r["ok"]]
            print(f"SP tail rank {rk['rank']} (NCCL): {len(rk['rows']) - len(bad)}/{len(rk['rows'])} ok"
                  + (f"; failing {bad}" if bad else ""))
            for bk, t in rk["times_us"].items():
                print(f"    tokens {bk:>5}: packed gather {t['packed']:.1f} us vs 4 gathers {t['separate']:.1f} us")
    else:
        print(f"SP tail: {sp}")
    result["ok"] = ok
    print("result:", "OK" if ok else "MISMATCH")
    if OUT:
        Path(OUT).mkdir(parents=True, exist_ok=True)
        (Path(OUT) / "gpu_executor_check.json").write_text(json.dumps(result, indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
