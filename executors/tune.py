"""Autotuning: time every eligible GEMM backend/config and every region variant per dim bucket.

    planner tune PLAN [--set k=v] [-o tuning.json] [--max-configs N] [--iters 20 --trials 5]

On a GPU, for every gemm of the compiled plan (all variants) and every bucket of the
plan's dynamic dim, each candidate (torch.mm; executors.cute configs for the shape;
FlashInfer mm_bf16 sub-backends when importable and the GPU's capability allows) is
checked against an fp32 reference on fresh random inputs with a poisoned output, then
timed inside CUDA-graph replays (``iters`` steps per graph rotating ``nsets`` weight
sets so L2 does not flatter, two warm-ups, median of ``trials`` replays in alternating
order). Then every region's variants are timed end to end per bucket with the winning
backends, at both ends of the M range the bucket serves (the slower counts; a library may
switch algorithms inside a bucket), and the limits the gates read (``tuned.NAME``) are derived from those
measurements: the largest bucket B such that the gated variant beat the fallback at
every bucket <= B (0 when it never wins).

Tuning file (JSON):
    {"device": str, "date": ISO-8601, "torch": str,
     "limits":   {tuned limit name: int},
     "backends": {op signature (planner.cost.op_signature): {"backend": str, "config": dict | null}},
     "measured": {op signature: us of the chosen backend},
     "variants": {region: {bucket: {variant: us}}},
     "candidates": {op signature: {candidate label: us}}   (optional, for the record)}

``planner compile --tuning F`` reads "limits" into the gates and "measured" into the cost
model. ``apply_tuning(executor, F)`` rewires every gemm step of a built executor to the
tuned backend/config of its signature (per call, by M: the entry of the smallest tuned
M >= this call's M); build_executor(..., tuning=F) calls it for a tuning file (one with a
"limits" key) before fusing gemm chains on top; tuned_executor() is that call for any dict.
"""

from __future__ import annotations

import datetime as _dt
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

__all__ = [
    "FORMAT_KEYS", "new_tuning", "validate_tuning", "load_tuning", "save_tuning", "derive_limit",
    "limit_gates", "parse_signature", "gemm_runner", "apply_tuning", "tuned_executor", "tunable_shapes",
    "gemm_candidates", "time_gemm", "tune_plan", "ForcedGate", "capture_steps", "eager_times",
]

FORMAT_KEYS = ("device", "date", "torch", "limits", "backends", "measured", "variants")
_SIG = re.compile(r"^gemm:(?P<dtype>\w+):M=(?P<m>\d+),N=(?P<n>\d+),K=(?P<k>\d+)$")


# ------------------------------------------------------------------ the file format

def new_tuning(device: str = "cpu", torch_version: str = "", date: str | None = None) -> dict:
    return {"device": device, "date": date or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch_version, "limits": {}, "backends": {}, "measured": {}, "variants": {}}


def validate_tuning(data, where: str = "tuning") -> dict:
    """Check the structure; returns data. Raises ValueError naming the bad key."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: must be a JSON object")
    for k in ("limits", "backends", "measured", "variants"):
        if k in data and not isinstance(data[k], dict):
            raise ValueError(f"{where}: '{k}' must be an object")
    for k, v in data.get("limits", {}).items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{where}: limits.{k} must be a non-negative integer, got {v!r}")
    for k, v in data.get("measured", {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"{where}: measured['{k}'] must be a non-negative number, got {v!r}")
    for k, v in data.get("backends", {}).items():
        if not isinstance(v, dict) or not isinstance(v.get("backend"), str):
            raise ValueError(f"{where}: backends['{k}'] must be {{\"backend\": str, \"config\": object|null}}")
        if v.get("config") is not None and not isinstance(v["config"], dict):
            raise ValueError(f"{where}: backends['{k}'].config must be an object or null")
    return data


def load_tuning(src) -> dict:
    """A tuning file path or an already-loaded dict -> validated dict."""
    if isinstance(src, dict):
        return validate_tuning(src)
    data = json.loads(Path(src).read_text())
    return validate_tuning(data, str(src))


def save_tuning(data: dict, path) -> Path:
    validate_tuning(data)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = {k: data[k] for k in FORMAT_KEYS if k in data}
    ordered.update({k: v for k, v in data.items() if k not in ordered})
    path.write_text(json.dumps(ordered, indent=1, sort_keys=False) + "\n")
    return path


def parse_signature(sig: str):
    """'gemm:bf16:M=8,N=6144,K=7168' -> ('bf16', 8, 6144, 7168), or None for other ops."""
    m = _SIG.match(sig)
    if not m:
        return None
    return m["dtype"], int(m["m"]), int(m["n"]), int(m["k"])


# ------------------------------------------------------------------ limits from measurements

def derive_limit(times: dict, variant: str, fallback: str, min_gain: float = 0.0) -> int:
    """times: {bucket: {variant: us}}. The largest bucket B such that `variant` beat
    `fallback` by more than `min_gain` (a fraction) at every bucket <= B; 0 if it loses at
    the first. Buckets missing either time stop the scan (no evidence, no promotion)."""
    best = 0
    for b in sorted(times, key=int):
        t = times[b]
        a, f = t.get(variant), t.get(fallback)
        if a is None or f is None or not a < f * (1.0 - min_gain):
            break
        best = int(b)
    return best


def limit_gates(plan) -> dict:
    """{tuned limit name: (region id, variant gated by it, fallback variant)} from the gates' text."""
    out = {}
    for rid, reg in plan.regions.items():
        fb = reg.fallback.name
        for v in reg.variants:
            src = v.when_src or ""
            for name in re.findall(r"tuned\.(\w+)", src):
                out.setdefault(name, (rid, v.name, fb))
    return out


# ------------------------------------------------------------------ runners (timed and run alike)

def _m_tile(m: int, kind: str) -> int:
    if kind == "split_n":
        return 1 << (max(m, 1) - 1).bit_length()
    return 8 if m <= 8 else 16


def gemm_runner(backend: str, config: dict | None = None, out_dtype=None):
    """fn(a, w, out=None) -> a @ w.T with this backend/config; `out` may be a column slice."""
    import torch

    from .torch_ops import gemm_torch
    dt = out_dtype or torch.bfloat16
    if backend == "torch":
        return lambda a, w, out=None: gemm_torch(a, w, dt, out)
    if backend == "cute":
        from . import cute
        from .cute.config import Config
        base = Config.from_dict(config) if config else None
        per_m: dict = {}

        def run_cute(a, w, out=None):
            m, k = a.shape
            n = w.shape[0]
            cfg = per_m.get((m, n, k))
            if cfg is None:
                cfg = base
                if cfg is None or cfg.check(m, n, k) is not None:
                    cfg = cute.default_config(m, n, k) if base is None else Config.from_dict(
                        {**base.to_dict(), "m_tile": _m_tile(m, base.kind)})
                    if cfg.check(m, n, k) is not None:
                        cfg = cute.default_config(m, n, k)
                per_m[(m, n, k)] = cfg
            target = out if out is not None and out.stride(-1) == 1 else None
            if a.stride(1) != 1 or cute.supports(m, n, k, a.dtype, a.stride(0),
                                                 None if target is None else target.stride(0)) is not None:
                return gemm_torch(a, w, dt, out)
            r = cute.skinny_gemm(a, w, out=target, config=cfg)
            return r if out is None or r is out else out.copy_(r)
        return run_cute
    if backend.startswith("flashinfer"):
        from flashinfer import mm_bf16
        sub = backend.split(":", 1)[1] if ":" in backend else None
        if sub is None:
            major, minor = torch.cuda.get_device_capability()
            sub = "cudnn" if major * 10 + minor < 100 else "cute-dsl"

        def run_fi(a, w, out=None):
            target = out if out is not None and out.is_contiguous() else None
            r = mm_bf16(a if a.stride(1) == 1 else a.contiguous(), w.t(), out=target, out_dtype=dt, backend=sub)
            return r if out is None or r is out else out.copy_(r)
        return run_fi
    raise ValueError(f"unknown gemm backend '{backend}'")


def _static_int(d, params):
    from planner.expr import eval_int
    try:
        return int(eval_int(d, params))
    except Exception:  # noqa: BLE001 - symbolic in a dim: not tunable statically
        return None


def apply_tuning(ex, tuning) -> int:
    """Rewire the gemm steps of a built Executor to the tuned backends; returns how many.

    Per step, entries whose signature matches the op's dtype, N and K are kept by M; a call
    with M uses the entry of the smallest tuned M >= M (the bucket its graph was captured
    at), else the step's previous runner. Steps of fused gemm chains are left alone."""
    table = (load_tuning(tuning) if tuning is not None else {}).get("backends") or {}
    if not table:
        return 0
    import torch

    from .torch_ops import torch_dtype
    by_shape: dict = {}
    for sig, entry in table.items():
        p = parse_signature(sig)
        if p is None:
            continue
        dtype, m, n, k = p
        by_shape.setdefault((dtype, n, k), {})[m] = entry
    params = ex.plan.params
    g = ex.compiled.graph
    count = 0
    for st in ex._steps:
        if st.kind != "gemm" or st.run is None or str(st.backend or "").startswith("cute:fused"):
            continue  # a fused gemm chain (executors.gemm_chain) keeps its kernel
        op = g.nodes[st.id]["op"]
        a_spec, w_spec = (ex._specs[n] for n in op.inputs())
        n, k = _static_int(w_spec.shape[0], params), _static_int(w_spec.shape[1], params)
        entries = by_shape.get((a_spec.dtype, n, k))
        if not entries or (op.out_dtype not in (None, a_spec.dtype)):
            continue
        if getattr(op, "backend", "auto") not in (None, "auto"):
            continue  # an explicitly named backend wins over tuning
        orig = st.run
        dt = torch_dtype(op.out_dtype or a_spec.dtype)
        runners = {m: gemm_runner(e["backend"], e.get("config"), dt) for m, e in entries.items()}
        ms = sorted(runners)
        maxm = ms[-1]
        lut = [None] * (maxm + 1)
        for mm in range(maxm + 1):
            lut[mm] = runners[next(x for x in ms if x >= mm)]

        def run(ins, b, out, lut=lut, maxm=maxm, orig=orig):
            m = ins[0].shape[0]
            if m > maxm:
                return orig(ins, b, out)
            return lut[m](ins[0], ins[1], out)
        st.run = run
        st.backend = "tuned:" + ",".join(sorted({e["backend"] for e in entries.values()}))
        ex.backends[st.id] = st.backend
        count += 1
    del torch
    return count


def tuned_executor(compiled, weights, tuning=None, **kw):
    """build_executor with a tuning file: its limits (those the plan declares) go to the gates and
    its backends to apply_tuning, which build_executor calls before fusing gemm chains on top."""
    from .lowering import build_executor
    data = load_tuning(tuning) if tuning is not None else None
    if data is not None:
        data = {**data, "limits": dict(data.get("limits") or {})}
    return build_executor(compiled, weights, tuning=data, **kw)


def tunable_shapes(ex) -> set:
    """{(dtype, N, K)} of the gemm steps apply_tuning may rewire (fused chains excluded)."""
    out = set()
    g = ex.compiled.graph
    for st in ex._steps:
        if st.kind != "gemm" or st.run is None or str(st.backend or "").startswith("cute:fused"):
            continue
        op = g.nodes[st.id]["op"]
        a_spec, w_spec = (ex._specs[n] for n in op.inputs())
        out.add((a_spec.dtype, _static_int(w_spec.shape[0], ex.plan.params), _static_int(w_spec.shape[1], ex.plan.params)))
    return out


class ForcedGate:
    """A region gate that always picks one variant (for timing variants end to end)."""

    def __init__(self, region: str, variant: str, names):
        self.region, self.variant, self.names = region, variant, list(names)

    def choose(self, facts) -> str:
        return self.variant


# ------------------------------------------------------------------ candidates and timing

def gemm_candidates(m: int, n: int, k: int, max_configs: int = 24, flashinfer: bool = True) -> list:
    """[(backend, config dict | None)] eligible here, torch first, the cute default next."""
    import torch
    out = [("torch", None)]
    from . import cute
    if cute.available() and cute.supports(m, n, k, torch.bfloat16, k) is None:
        from .cute.config import configs_for, kind_for
        seen = set()
        cands = [cute.default_config(m, n, k)] + configs_for(m, n, k, kind=kind_for(n, k))
        for c in cands:
            if c.key() in seen or c.check(m, n, k) is not None:
                continue
            seen.add(c.key())
            out.append(("cute", c.to_dict()))
            if len(seen) >= max_configs:
                break
    if flashinfer and torch.cuda.is_available():
        try:
            import flashinfer  # noqa: F401
            ok = True
        except Exception:  # noqa: BLE001
            ok = False
        if ok:
            from .gemm_backends import FLASHINFER_SUBS
            major, minor = torch.cuda.get_device_capability()
            cc = major * 10 + minor
            for sub, need in FLASHINFER_SUBS.items():
                if cc >= need and (sub != "cute-dsl" or cc >= 100):
                    out.append((f"flashinfer:{sub}", None))
    return out


def cand_label(backend: str, config: dict | None) -> str:
    if backend == "cute" and config:
        from .cute.config import Config
        return "cute:" + Config.from_dict(config).key()
    return backend


def eager_times(fns: dict, iters: int, trials: int, sync=None) -> dict:
    """Median wall-clock us per step of eager calls f(i), one warm-up call each; `sync`
    (e.g. a barrier) runs before every trial. The CPU dry runs of tune and bench use it."""
    res = {}
    for name, f in fns.items():
        f(0)
        ts = []
        for _ in range(trials):
            if sync is not None:
                sync()
            t0 = time.perf_counter()
            for i in range(iters):
                f(i)
            ts.append((time.perf_counter() - t0) / iters * 1e6)
        res[name] = statistics.median(ts)
    return res


def capture_steps(f, iters: int, warmup: int, nsets: int, sync=None):
    """One CUDA graph of `iters` steps f(i) (step i uses weight set i % nsets), captured on a side
    stream after `warmup` rounds over every set; `sync` (e.g. a barrier) runs just before capture."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            for i in range(nsets):
                f(i)
    torch.cuda.synchronize()
    if sync is not None:
        sync()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for i in range(iters):
            f(i)
    torch.cuda.synchronize()
    return g


def time_graphs(fns: dict, iters: int = 20, trials: int = 5, warmup: int = 2, nsets: int = 4) -> dict:
    """fns: {name: f(i)} where step i uses weight set i % nsets. One graph of `iters` steps per
    name, captured on a side stream after warm-ups; every trial replays them in a new (seeded)
    random order, so no path always follows the same neighbour; median us/step."""
    import torch
    if not torch.cuda.is_available():  # CPU dry run: eager wall clock, same interface
        return eager_times(fns, iters, trials)
    graphs = {}
    for name, f in fns.items():
        g = capture_steps(f, iters, warmup, nsets)
        g.replay()
        g.replay()
        graphs[name] = g
    torch.cuda.synchronize()
    times = {n: [] for n in graphs}
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    order, rng = list(graphs), random.Random(0)
    for _ in range(trials):
        rng.shuffle(order)
        for n in order:
            e0.record()
            graphs[n].replay()
            e1.record()
            e1.synchronize()
            times[n].append(e0.elapsed_time(e1) * 1000.0 / iters)
    del graphs
    return {n: statistics.median(v) for n, v in times.items()}


def _rel_err(out, ref) -> float:
    o = out.float()
    if not bool(__import__("torch").isfinite(o).all()):
        return float("inf")
    return float((o - ref).norm() / ref.norm().clamp_min(1e-30))


def time_gemm(m: int, n: int, k: int, cands: list, iters=20, trials=5, nsets=4, log=None, dev="cuda") -> dict:
    """{label: us} for each candidate that computes the right result (others: {label: None})."""
    import torch
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5 for _ in range(nsets)]
    outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(nsets)]
    ref = x.float() @ ws[0].float().t()
    fns, res = {}, {}
    for backend, cfg in cands:
        label = cand_label(backend, cfg)
        try:
            r = gemm_runner(backend, cfg)
            outs[0].fill_(float("nan"))
            got = r(x, ws[0], outs[0])
            if dev != "cpu":
                torch.cuda.synchronize()
            err = _rel_err(got, ref)
            if not err < 1e-2:
                raise AssertionError(f"rel err {err:.2e}")
        except Exception as exc:  # noqa: BLE001 - a broken candidate is reported and skipped
            res[label] = None
            if log:
                log(f"    {label}: skipped ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        fns[label] = (lambda i, r=r: r(x, ws[i % nsets], outs[i % nsets]))
    if fns:
        res.update(time_graphs(fns, iters=iters, trials=trials, nsets=nsets))
    ws = outs = None
    return res


# ------------------------------------------------------------------ the tuner

def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def plan_gemms(cp, dim: str, buckets: list) -> dict:
    """{signature: (dtype, M, N, K)} of every gemm in the compiled plan at every bucket."""
    from planner.cost import op_signature
    g = cp.graph
    sigs = {}
    for v in cp.schedule or list(g.nodes):
        op = g.nodes[v]["op"]
        if op.op != "gemm":
            continue
        specs = [cp.tensors[n] for n in op.inputs()]
        for b in buckets:
            bind = {**cp.plan.params, **{d: cp.plan.dims[d].hi for d in cp.plan.dims}, dim: b}
            try:
                sig = op_signature(op, specs, bind)
            except Exception:  # noqa: BLE001
                continue
            p = parse_signature(sig)
            if p is not None:
                sigs[sig] = p
    return sigs


def _variant_sigs(cp, dim: str, bucket: int) -> dict:
    """{(region, variant): [gemm signatures of the ops guarded by that variant]} at this bucket."""
    from planner.cost import op_signature
    g = cp.graph
    bind = {**cp.plan.params, **{d: cp.plan.dims[d].hi for d in cp.plan.dims}, dim: bucket}
    out: dict = {}
    for v in g.nodes:
        d = g.nodes[v]
        op = d["op"]
        if op.op != "gemm" or not d.get("ctx"):
            continue
        try:
            sig = op_signature(op, [cp.tensors[n] for n in op.inputs()], bind)
        except Exception:  # noqa: BLE001
            continue
        for rv in d["ctx"]:
            lst = out.setdefault(tuple(rv), [])
            if sig not in lst:
                lst.append(sig)
    return out


def bucket_probes(buckets: list, lo: int = 1) -> list:
    """[(bucket, [M...])]: each bucket with the ends of the M range it serves (the previous
    bucket + 1, or the dim's lower bound, up to the bucket itself)."""
    out, prev = [], None
    for b in sorted(buckets):
        first = max(lo, 1) if prev is None else prev + 1
        out.append((b, sorted({min(first, b), b})))
        prev = b
    return out


def time_variants(cp_factory, plan_factory, tuning: dict, dim: str, buckets: list, iters=20, trials=5,
                  nsets=4, log=_log, dev="cuda", alternatives: dict | None = None) -> dict:
    """{region: {bucket: {variant: us}}}: each region forced to each of its variants (all regions
    to the same variant name where they have it), graph replay, `nsets` executors with their own
    weights rotated, with the tuned backends.

    alternatives: {signature: (backend, config)} -- a second choice per gemm (torch when the
    standalone winner is a kernel, else the best kernel). Per bucket and variant, each gemm of
    the variant is switched to its alternative once (greedy); the switch is kept in
    tuning["backends"] when the whole variant gets faster (standalone winners need not win
    together: two kernels that each saturate HBM do not overlap). Then all variants are timed
    again with the final choices; those times are what the limits are derived from.

    A bucket serves every M from the previous bucket + 1 up to itself, so each time here is the
    worse of the bucket's two ends (bucket_probes): a library may pick another algorithm inside
    the bucket (H200: at M = 13..15 cuBLAS's split-K F_A kernel did not run beside the QKVG
    kernel, at 16 it did, so the two-branch variant took 29.8 instead of 26.7 us)."""
    import torch

    from .check import make_data
    from .externs import default_externs
    plan = plan_factory()
    regions = plan.regions
    if not regions:
        return {}
    names = sorted({v.name for r in regions.values() for v in r.variants})
    exs = []
    for s in range(nsets):
        p = plan_factory()
        cp = cp_factory(p)
        _, w = make_data(p, {d: plan.dims[d].hi for d in plan.dims}, seed=100 + s, rank=0, device=dev)
        exs.append(tuned_executor(cp, w, tuning, device=dev, externs=default_externs(p)))
    table = tuning.setdefault("backends", {})
    tuning.setdefault("refinements", [])
    out: dict = {r: {} for r in regions}
    for b, probes in bucket_probes(buckets, plan.dims[dim].lo):
        data = {}
        for m in probes:
            bind = {**{d: plan.dims[d].hi for d in plan.dims}, dim: m}
            data[m] = (bind, make_data(plan, bind, seed=7 + m, rank=0, device=dev)[0])

        def make(name, m, data=data):
            bind, ins = data[m]

            def f(i):
                ex = exs[i % nsets]
                saved = dict(ex._gates)
                for rid, reg in regions.items():
                    vn = [v.name for v in reg.variants]
                    ex._gates[rid] = ForcedGate(rid, name if name in vn else vn[-1], vn)
                try:
                    return ex(dims=dict(bind), **ins)
                finally:
                    ex._gates.clear()
                    ex._gates.update(saved)
            return f

        def worst(vnames, probes=probes, b=b, make=make):
            """{variant: us}, the slower of the bucket's ends; logs both where there are two."""
            per = {m: time_graphs({n: make(n, m) for n in vnames}, iters=iters, trials=trials, nsets=nsets)
                   for m in probes}
            if len(probes) > 1:
                log(f"[tune]   {dim}={b} ends " + "; ".join(
                    f"{m}: " + ", ".join(f"{n} {per[m][n]:.2f}" for n in vnames) for m in probes))
            return {n: max(per[m][n] for m in probes) for n in vnames}

        if alternatives:
            vsigs = _variant_sigs(exs[0].compiled, dim, b)
            for (rid, vname), sigs in sorted(vsigs.items()):
                if rid != next(iter(regions)):   # regions alike (layers): refine on the first
                    continue
                cur = worst([vname])[vname]
                shapes = tunable_shapes(exs[0])
                for sig in sigs:
                    alt = alternatives.get(sig)
                    parsed = parse_signature(sig)
                    if alt is None or sig not in table or parsed is None or (parsed[0],) + parsed[2:] not in shapes:
                        continue
                    old = dict(table[sig])
                    table[sig] = {"backend": alt[0], "config": alt[1]}
                    for ex in exs:
                        apply_tuning(ex, tuning)
                    t_alt = worst([vname])[vname]
                    keep = t_alt < cur * 0.995
                    tuning["refinements"].append({"bucket": b, "variant": vname, "signature": sig, "from": old,
                                                  "to": table[sig], "us_before": round(cur, 3),
                                                  "us_after": round(t_alt, 3), "kept": keep})
                    log(f"[tune]   {dim}={b} {vname}: {sig} {old['backend']} -> {alt[0]}: {cur:.2f} -> {t_alt:.2f} us"
                        f" ({'kept' if keep else 'reverted'})")
                    if keep:
                        cur = t_alt
                    else:
                        table[sig] = old
                        for ex in exs:
                            apply_tuning(ex, tuning)
        t = worst(names)
        for rid, reg in regions.items():
            vn = {v.name for v in reg.variants}
            out[rid][str(b)] = {n: round(us, 3) for n, us in t.items() if n in vn}
        log(f"[tune] variants {dim}={b}: " + ", ".join(f"{n} {us:.2f} us" for n, us in t.items()))
    exs = None
    if dev != "cpu":
        torch.cuda.empty_cache()
    return out


def tune_plan(path: str, overrides: dict | None = None, *, dim: str = "num_tokens", buckets=None,
              max_configs: int = 24, iters: int = 20, trials: int = 5, nsets: int = 4,
              variants: bool = True, min_gain: float = 0.0, flashinfer: bool = True, budget_s: float | None = None,
              log=_log, device: str = "cuda", refine: bool = True) -> dict:
    """Tune a plan (see the module doc). device="cpu" is a dry run: eager timing, torch only."""
    import torch

    from planner.loader import load_plan
    from planner.pipeline import compile_plan
    if device != "cpu" and not torch.cuda.is_available():
        raise RuntimeError("planner tune needs a CUDA GPU (it times kernels)")
    load = lambda: load_plan(path, dict(overrides or {}))  # noqa: E731
    plan = load()
    if dim not in plan.dims:
        raise ValueError(f"plan '{plan.name}' has no dim '{dim}' (dims: {sorted(plan.dims)})")
    bks = sorted(buckets or plan.dims[dim].buckets)
    cp = compile_plan(load())
    sigs = plan_gemms(cp, dim, bks)
    res = new_tuning(torch.cuda.get_device_name() if device != "cpu" else "cpu (dry run)", torch.__version__)
    res["candidates"] = {}
    alternatives = {}
    t0 = time.time()
    log(f"[tune] plan {plan.name}: {len(sigs)} gemm signature(s) over {dim} buckets {bks}")
    for i, (sig, (dtype, m, n, k)) in enumerate(sorted(sigs.items(), key=lambda kv: (kv[1][2], kv[1][3], kv[1][1]))):
        if dtype != "bf16":
            log(f"[tune] ({i + 1}/{len(sigs)}) {sig}: {dtype} not tuned (bf16 only)")
            continue
        over = budget_s is not None and time.time() - t0 > budget_s
        cands = [("torch", None)] if device == "cpu" else gemm_candidates(
            m, n, k, max_configs=1 if over else max_configs, flashinfer=flashinfer)
        if over:
            log(f"[tune] time budget {budget_s:.0f}s spent: {sig} gets torch + the default config only")
        times = time_gemm(m, n, k, cands, iters=iters, trials=trials, nsets=nsets, log=log, dev=device)
        ok = {lab: us for lab, us in times.items() if us is not None}
        best = min(ok, key=ok.get)
        be, cfg = next((b, c) for b, c in cands if cand_label(b, c) == best)
        res["backends"][sig] = {"backend": be, "config": cfg}
        res["measured"][sig] = round(ok[best], 3)
        res["candidates"][sig] = {lab: (None if us is None else round(us, 3)) for lab, us in times.items()}
        if be != "torch" and "torch" in ok:
            alternatives[sig] = ("torch", None)
        elif be == "torch":
            others = [lab for lab in ok if lab != "torch"]
            if others:
                lab2 = min(others, key=ok.get)
                alternatives[sig] = next((b, c) for b, c in cands if cand_label(b, c) == lab2)
        log(f"[tune] ({i + 1}/{len(sigs)}) {sig}: {len(ok)}/{len(cands)} candidates; best {best} {ok[best]:.2f} us"
            f" (torch {ok.get('torch', float('nan')):.2f} us) [{time.time() - t0:.0f}s]")
    if variants and plan.regions:
        res["variants"] = time_variants(lambda p: compile_plan(p), load, res, dim, bks, iters=iters,
                                        trials=trials, nsets=nsets, log=log, dev=device,
                                        alternatives=alternatives if refine else None)
        for sig, e in res["backends"].items():  # the cost model gets the time of what was chosen
            us = res["candidates"].get(sig, {}).get(cand_label(e["backend"], e.get("config")))
            if us is not None:
                res["measured"][sig] = us
        for name, (rid, v, fb) in limit_gates(plan).items():
            res["limits"][name] = derive_limit(res["variants"].get(rid, {}), v, fb, min_gain)
            log(f"[tune] limit {name} = {res['limits'][name]} ({v} vs {fb} in {rid})")
    log(f"[tune] done in {time.time() - t0:.0f}s")
    return res
