"""Autotuning: time every eligible GEMM backend/config and every region variant per dim bucket
(norms, activations, rope, quantize and scaled fp8 gemms: executors/tools/tune_ops.py).

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

The tuning file's format is planner.tuning (validated there); build_executor(..., tuning=F)
applies its "backends" to the lowered gemm steps (executors.tuning.apply_tuning) and its
"limits" to the gates; tuned_executor() is that call for any dict.
"""

from __future__ import annotations

import re
import sys
import time

from planner.tuning import (
    FORMAT_KEYS,
    load_tuning,
    new_tuning,
    parse_signature,
    save_tuning,
    validate_tuning,
)

from ..backends.gemm import gemm_runner
from ..tuning import apply_tuning, static_int
from .timing import time_graphs

__all__ = [
    "FORMAT_KEYS", "new_tuning", "validate_tuning", "load_tuning", "save_tuning", "derive_limit",
    "limit_gates", "parse_signature", "gemm_runner", "apply_tuning", "tuned_executor", "tunable_shapes",
    "gemm_candidates", "time_gemm", "tune_plan", "ForcedGate",
]

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

def tuned_executor(compiled, weights, tuning=None, **kw):
    """build_executor with a tuning file: its limits (those the plan declares) go to the gates and
    its backends to apply_tuning, which build_executor calls before fusing gemm chains on top."""
    from ..lowering import build_executor
    data = load_tuning(tuning) if tuning is not None else None
    if data is not None:
        data = {**data, "limits": dict(data.get("limits") or {})}
    return build_executor(compiled, weights, tuning=data, **kw)


def tunable_shapes(ex) -> set:
    """{(dtype, N, K)} of the gemm steps apply_tuning may rewire (gemm_chain ops excluded)."""
    out = set()
    g = ex.compiled.graph
    for st in ex._steps:
        if st.kind != "gemm" or st.run is None:
            continue
        op = g.nodes[st.id]["op"]
        if getattr(op, "scaled", False):
            continue
        a_spec, w_spec = (ex._specs[n] for n in op.inputs())
        out.add((a_spec.dtype, static_int(w_spec.shape[0], ex.plan.params), static_int(w_spec.shape[1], ex.plan.params)))
    return out


def live_variants(compiled) -> dict:
    """{region: [variant names]} of the compiled plan: dce removes the variants whose gate folds to
    false under the params (KDA's two_branch at tp_size 4), and the executor has no such variant
    to force."""
    return {rid: [v.name for v in vs] for rid, vs in compiled.variants.items()}


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
    from .. import cute
    if cute.available() and cute.supports(m, n, k, torch.bfloat16, k) is None:
        from ..cute.config import configs_for, kind_for
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
            from ..backends.gemm import FLASHINFER_SUBS
            major, minor = torch.cuda.get_device_capability()
            cc = major * 10 + minor
            for sub, need in FLASHINFER_SUBS.items():
                if cc >= need and (sub != "cute-dsl" or cc >= 100):
                    out.append((f"flashinfer:{sub}", None))
    return out


def cand_label(backend: str, config: dict | None) -> str:
    if backend == "cute" and config:
        from ..cute.config import Config
        return "cute:" + Config.from_dict(config).key()
    return backend


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
    """{signature: (dtype, M, N, K)} of every GEMM in the compiled plan (gemm ops and both GEMMs of
    a gemm_chain) at every bucket."""
    from planner.cost import gemm_signatures
    g = cp.graph
    sigs = {}
    for v in cp.schedule or list(g.nodes):
        op = g.nodes[v]["op"]
        specs = [cp.tensors[n] for n in op.inputs()]
        for b in buckets:
            bind = {**cp.plan.params, **{d: cp.plan.dims[d].hi for d in cp.plan.dims}, dim: b}
            try:
                found = gemm_signatures(op, specs, bind)
            except Exception:  # noqa: BLE001
                continue
            for sig in found:
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
        if op.op != "gemm" or not d.get("ctx"):  # (a gemm_chain keeps its fused kernel)
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
                  nsets=4, log=_log, dev="cuda", alternatives: dict | None = None, externs: dict | None = None) -> dict:
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
    if not plan.regions:
        return {}
    exs = []
    for s in range(nsets):
        p = plan_factory()
        cp = cp_factory(p)
        _, w = make_data(p, {d: plan.dims[d].hi for d in plan.dims}, seed=100 + s, rank=0, device=dev)
        exs.append(tuned_executor(cp, w, tuning, device=dev, externs={**default_externs(p), **(externs or {})}))
    regions = live_variants(exs[0].compiled)
    names = sorted({n for vn in regions.values() for n in vn})
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
                for rid, vn in regions.items():
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
        for rid, vn in regions.items():
            out[rid][str(b)] = {n: round(us, 3) for n, us in t.items() if n in vn}
        log(f"[tune] variants {dim}={b}: " + ", ".join(f"{n} {us:.2f} us" for n, us in t.items()))
    exs = None
    if dev != "cpu":
        torch.cuda.empty_cache()
    return out


def tune_plan(path: str, overrides: dict | None = None, *, dim: str = "num_tokens", buckets=None,
              max_configs: int = 24, iters: int = 20, trials: int = 5, nsets: int = 4,
              variants: bool = True, min_gain: float = 0.0, flashinfer: bool = True, budget_s: float | None = None,
              log=_log, device: str = "cuda", refine: bool = True, externs: dict | None = None,
              externs_from: str | None = None) -> dict:
    """Tune a plan (see the module doc). device="cpu" is a dry run: eager timing, torch only.
    externs: the caller's model-code implementations; each extern site is then timed per bucket
    (executors.tools.tune_externs) and the region variants run with them."""
    import torch

    from planner.lang.loader import load_plan
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
    if device != "cpu":  # what shipped-tuning matching compares (planner.tuning.match_tuning)
        major, minor = torch.cuda.get_device_capability()
        res["cc"] = major * 10 + minor
        res["versions"] = {"torch": ".".join(torch.__version__.split("+")[0].split(".")[:2])}
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
    from .tune_ops import tune_keyed  # norms, activations, rope, quantize, scaled fp8 gemms
    tune_keyed(cp, dim, bks, res, device=device, iters=iters, trials=trials, nsets=nsets, log=log)
    if externs:
        from .tune_externs import tune_externs
        res["externs"] = externs_from or "the externs= mapping given to tune_plan"
        tune_externs(cp, dim, bks, res, externs, device=device, iters=iters, trials=trials, nsets=nsets, log=log)
    if variants and plan.regions:
        res["variants"] = time_variants(lambda p: compile_plan(p), load, res, dim, bks, iters=iters,
                                        trials=trials, nsets=nsets, log=log, dev=device,
                                        alternatives=alternatives if refine else None, externs=externs)
        for sig, e in res["backends"].items():  # the cost model gets the time of what was chosen
            us = res["candidates"].get(sig, {}).get(cand_label(e["backend"], e.get("config")))
            if us is not None:
                res["measured"][sig] = us
        for name, (rid, v, fb) in limit_gates(plan).items():
            res["limits"][name] = derive_limit(res["variants"].get(rid, {}), v, fb, min_gain)
            log(f"[tune] limit {name} = {res['limits'][name]} ({v} vs {fb} in {rid})")
    log(f"[tune] done in {time.time() - t0:.0f}s")
    return res
