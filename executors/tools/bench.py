"""Benchmarks: compiled plan vs its unfused reference vs the floor, under CUDA-graph replay.

    planner bench PLAN [--set k=v] [--tokens 1,2,4,8] [--tuning F] [--world-size N] [--out DIR]

Per value of the dynamic dim, in one process and run: (1) correctness first (fresh random
inputs, every output of the compiled plan, eagerly and from a captured graph whose static
outputs were poisoned with NaN, against the unfused single-stream reference plan), then
(2) timing: one graph of `iters` steps per path, `nsets` weight/input sets rotated, two
warm-ups, median over `trials` replays in alternating order; for plans with collectives
a barrier before every trial and the max over ranks. Floor: weight bytes over the HBM
read bandwidth measured in the same run, plus received bytes over the peer-copy (NVLink)
bandwidth measured in the same run. Prints a table last; --out writes JSON, CSV and
Markdown. Plan-specific hand-written paths (before/after of the seed PRs) live in
scripts/bench_kda_step.py and scripts/bench_sp_gather.py, which use these helpers.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import subprocess
import sys
from pathlib import Path

from .timing import eager_times_dist, hbm_bandwidth, peer_bandwidth, time_graphs, time_graphs_dist

__all__ = ["env_info", "md_table", "write_report", "bench_plan", "close_report", "parse_tokens"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


MAX_SIZES = 65536  # sizes one --tokens / --buckets may list: each is a timed run


class SizeOutOfRange(ValueError):
    """A size (or a range's end) outside the bounds parse_tokens was given; `value` names it."""

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value


class TooManySizes(ValueError):
    """More than MAX_SIZES sizes; `count` says how many were asked for."""

    def __init__(self, count: int):
        super().__init__(count)
        self.count = count


def parse_tokens(text: str | None, default: list, bounds: tuple[int, int] | None = None) -> list:
    """'1,2,4..8' -> [1, 2, 4, 5, 6, 7, 8] (sorted, no repeats); default for none. ValueError for
    anything but integers and LO..HI ranges; SizeOutOfRange for a size outside `bounds` and
    TooManySizes past MAX_SIZES, both checked before a range is expanded (1..10**10 is refused,
    not built)."""
    if not text:
        return list(default)

    def inside(v: int) -> int:
        if bounds is not None and not bounds[0] <= v <= bounds[1]:
            raise SizeOutOfRange(v)
        return v
    out = []
    for part in text.split(","):
        part = part.strip()
        if ".." in part:
            lo, hi = part.split("..")
            lo, hi = int(lo), int(hi)
            if lo <= hi:
                inside(lo)
                inside(hi)
                if len(out) + hi - lo + 1 > MAX_SIZES:
                    raise TooManySizes(len(out) + hi - lo + 1)
                out.extend(range(lo, hi + 1))
        elif part:
            out.append(inside(int(part)))
    return sorted(set(out))


# ------------------------------------------------------------------ environment and ceilings

def env_info() -> dict:
    import torch
    info = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
            "python": sys.version.split()[0], "command": " ".join(sys.argv)}
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
        info["gpus"] = torch.cuda.device_count()
        info["cuda"] = torch.version.cuda
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001
            pass
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.split()[0]
        except Exception:  # noqa: BLE001
            info["driver"] = "unknown"
    try:
        from importlib.metadata import version
        info["cutlass_dsl"] = version("nvidia-cutlass-dsl")
    except Exception:  # noqa: BLE001
        info["cutlass_dsl"] = None
    try:
        import flashinfer
        info["flashinfer"] = flashinfer.__version__
    except Exception:  # noqa: BLE001
        info["flashinfer"] = None
    return info


# ------------------------------------------------------------------ reports

def md_table(rows: list[dict], cols: list[tuple]) -> str:
    """cols: [(key, header, format)] -> a Markdown table."""
    head = "| " + " | ".join(h for _, h, _ in cols) + " |"
    sep = "|" + "|".join("---:" for _ in cols) + "|"
    lines = [head, sep]
    for r in rows:
        cells = []
        for k, _, f in cols:
            v = r.get(k)
            cells.append("-" if v is None else (format(v, f) if f else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(out_dir, stem: str, meta: dict, rows: list[dict], cols: list[tuple], title: str,
                 notes: list[str] | None = None) -> str:
    table = md_table(rows, cols)
    text = f"# {title}\n\n" + "\n".join(f"- {k}: {v}" for k, v in meta.items() if not isinstance(v, (dict, list))) \
        + "\n\n" + table + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")
    if out_dir:
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{stem}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1, default=str) + "\n")
        (d / f"{stem}.md").write_text(text)
        keys = [k for k, _, _ in cols]
        with open(d / f"{stem}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(keys)
            for r in rows:
                w.writerow([r.get(k) for k in keys])
    return table


def close_report(got: dict, want: dict, exact: dict | None = None) -> tuple[bool, dict]:
    """Compare output dicts: bit-exact where exact[name], else cosine > 0.999 and rel < 1e-2 (fp32)."""
    import torch
    ok, errs = True, {}
    for n, r in want.items():
        a = got[n]
        if a.shape != r.shape:
            errs[n] = f"shape {tuple(a.shape)} vs {tuple(r.shape)}"
            ok = False
            continue
        if exact and exact.get(n):
            good = bool(torch.equal(a, r.to(a.dtype)))
            errs[n] = "exact" if good else "DIFFERS"
        else:
            x, y = a.float().flatten(), r.float().flatten()
            finite = bool(torch.isfinite(x).all())
            rel = float((x - y).norm() / y.norm().clamp_min(1e-30)) if finite else float("inf")
            cos = float(torch.nn.functional.cosine_similarity(x, y, dim=0)) if finite and x.numel() else 1.0
            good = finite and rel < 1e-2 and cos > 0.999
            errs[n] = round(rel, 6)
        ok &= good
    return ok, errs


# ------------------------------------------------------------------ generic plan bench (`planner bench`)

def _plan_bytes(plan, bind: dict, world: int) -> tuple[int, int]:
    """(weight bytes read once, bytes each rank receives through its collectives) at these dims."""
    from planner.expr import eval_int
    from planner.shapes import DTYPES
    full = {**plan.params, **bind}
    wb = 0
    for n in plan.weights:
        s = plan.tensors[n]
        k = DTYPES[s.dtype]
        for d in s.shape:
            k *= eval_int(d, full)
        wb += k
    rb = 0
    for op in plan.ops:
        if op.op == "all_gather" and world > 1:
            s = plan.tensors[op.inputs()[0]]
            k = DTYPES[s.dtype]
            for d in s.shape:
                k *= eval_int(d, full)
            rb += k * (world - 1)
    return wb, rb


def _bench_body(rank, world, path, overrides, tokens, tuning, iters, trials, nsets, link, cpu=False):
    import torch

    from planner.lang.loader import load_plan
    from planner.pipeline import compile_plan

    from .check import _exactness, make_data, reference_compiled
    from .externs import default_externs
    from .tune import tuned_executor
    dev = "cpu" if cpu else f"cuda:{rank}"
    if not cpu:
        torch.cuda.set_device(dev)
    dist = world > 1
    load = lambda: load_plan(path, dict(overrides))  # noqa: E731
    plan = load()
    dim = "num_tokens" if "num_tokens" in plan.dims else next(iter(plan.dims))
    # read bandwidth before and after the timings; the floor uses the higher one (a 2 GiB sum
    # moved by up to 6% between runs, and between the start and end of one run, on one H200)
    bw0 = None if cpu else hbm_bandwidth()
    hi = {d: plan.dims[d].hi for d in plan.dims}
    exs, refs = [], []
    from .ranks import run_groups
    groups = run_groups(plan.groups, world)  # as planner run binds them: one process group per plan group
    for s in range(nsets):
        p = load()
        _, w = make_data(p, hi, seed=1000 + s, rank=rank, device=dev)
        exs.append(tuned_executor(compile_plan(p), w, tuning, device=dev, externs=default_externs(p), group=groups))
        rp = load()
        # the reference takes the tuning's limits (the same variants) but none of its backends, as
        # planner run's does: with no tuning given, the shipped one's tuned backends would replace torch
        refs.append(tuned_executor(reference_compiled(rp), w, {"limits": dict(exs[-1].tuned)}, device=dev,
                                   externs=default_externs(rp), backend_prefs=("torch",), group=groups))
    exact = _exactness(reference_compiled(load()))
    rows = []
    for t in tokens:
        bind = {**hi, dim: t}
        ins, _ = make_data(plan, bind, seed=t * 31 + 1, rank=rank, device=dev)
        want = refs[0](dims=dict(bind), **ins)
        got = exs[0](dims=dict(bind), **ins)
        ok_e, err_e = close_report(got, want, exact)
        ok_g, err_g = (True, "cpu: no graph") if cpu else _graph_check(exs[0], bind, ins, want, exact)
        fns = {"reference": lambda i, b=bind, ins=ins: refs[i % nsets](dims=dict(b), **ins),
               "compiled": lambda i, b=bind, ins=ins: exs[i % nsets](dims=dict(b), **ins)}
        if dist and cpu:
            tm = eager_times_dist(fns, iters, trials)
        else:
            tm = time_graphs_dist(fns, iters, trials, nsets=nsets) if dist else time_graphs(fns, iters, trials, nsets=nsets)
        row = {"tokens": t, "reference_us": round(tm["reference"], 2), "compiled_us": round(tm["compiled"], 2),
               "floor_us": None, "speedup": round(tm["reference"] / tm["compiled"], 3), "over_floor": None,
               "ok": ok_e and ok_g, "variants": dict(exs[0].last_variants), "err": {"eager": err_e, "graph": err_g}}
        rows.append(row)
        if rank == 0:
            log(f"[bench] {dim}={t}: reference {row['reference_us']:.2f} us, compiled {row['compiled_us']:.2f} us"
                f" ({row['speedup']:.2f}x), check {'ok' if row['ok'] else 'FAILED'}")
    bw = {"sum_read_TBps": None}
    if not cpu:
        bw1 = hbm_bandwidth()
        bw = {"start": bw0, "end": bw1, "sum_read_TBps": max(bw0["sum_read_TBps"], bw1["sum_read_TBps"])}
        for row in rows:
            wb, rb = _plan_bytes(plan, {**hi, dim: row["tokens"]}, world)
            floor = wb / (bw["sum_read_TBps"] * 1e6) + (rb / (link * 1e3) if rb and link else 0.0)
            row["floor_us"] = round(floor, 2)
            row["over_floor"] = round(row["compiled_us"] / floor, 3) if floor else None
        if rank == 0:
            log(f"[bench] HBM read {bw0['sum_read_TBps']:.3f} / {bw1['sum_read_TBps']:.3f} TB/s (start / end);"
                f" floors use {bw['sum_read_TBps']:.3f}")
    return {"rank": rank, "rows": rows, "hbm": bw, "backends": dict(exs[0].backends)}


def _graph_check(ex, bind, ins, want, exact):
    """The executor captured in a caller's graph, static outputs poisoned before the replay."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ex(dims=dict(bind), **ins)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        static = ex(dims=dict(bind), **ins)
    for v in static.values():
        if v.is_floating_point():
            v.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return close_report(static, want, exact)


def bench_plan(path: str, overrides: dict | None, tokens: list, tuning=None, world: int = 1, iters=20,
               trials=5, nsets=4, device: str = "cuda") -> dict:
    """device="cpu": a dry run (gloo ranks, eager timing, no graphs, no floor)."""
    import torch

    from .tune import load_tuning
    cpu = device == "cpu"
    if not cpu and not torch.cuda.is_available():
        raise RuntimeError("planner bench needs a CUDA GPU")
    tdata = load_tuning(tuning) if tuning else None
    link = None
    if world > 1 and cpu:
        from .ranks import run_ranks
        res = run_ranks(_bench_body, world, path, dict(overrides or {}), tokens, tdata, iters, trials, min(nsets, 2),
                        None, True, backend="gloo", timeout_s=300)
    elif world > 1:
        if torch.cuda.device_count() < world:
            raise RuntimeError(f"--world-size {world} needs {world} GPUs, found {torch.cuda.device_count()}")
        link = peer_bandwidth(0, 1)["GBps"]
        from .ranks import run_ranks
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        res = run_ranks(_bench_body, world, path, dict(overrides or {}), tokens, tdata, iters, trials, min(nsets, 2),
                        link, backend="nccl", timeout_s=580, coll_timeout_s=120)
    else:
        res = [_bench_body(0, 1, path, dict(overrides or {}), tokens, tdata, iters, trials, nsets, None, cpu)]
    rows = res[0]["rows"]
    for r in rows:
        r["ok"] = all(x["rows"][rows.index(r)]["ok"] for x in res)
    return {**env_info(), "plan": path, "overrides": overrides, "world_size": world, "link_GBps": link,
            "hbm": res[0]["hbm"], "backends": res[0]["backends"], "rows": rows}


BENCH_COLS = [("tokens", "tokens", ""), ("reference_us", "unfused ref (us)", ".2f"),
              ("compiled_us", "compiled (us)", ".2f"), ("floor_us", "floor (us)", ".2f"),
              ("speedup", "ref/compiled", ".3f"), ("over_floor", "compiled/floor", ".3f"), ("ok", "check", "")]
