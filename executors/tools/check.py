"""Compiled vs reference: run a plan on seeded random data and compare every output.

The reference is the UNFUSED plan as loaded: planner.graph.build_graph(plan) with
every op on the main stream, executed op by op in plan order with the torch backend.
The compiled side is planner.pipeline.compile_plan(plan) (fusion, streams, events,
packed slots) lowered with the chosen backends. Both see the same inputs, weights,
dims and facts, so both take the same variants.

Comparison: an output whose reference ancestry is pure data movement (split, cat,
slice, pad, shard, copy, view, select, all_gather) must be bit-exact; one that went
through arithmetic (gemm, add, reductions, externs fed by those) must be allclose with the
tolerance of the lowest precision that arithmetic rounded to (not the dtype the output is
returned in).

Every variant is checked, not only the one the gates pick here: after the run the
gates choose, the compiled executor runs again once per variant name with that
variant forced in every region that has it (capture-only variants included: the gate
is forced and the variant runs eagerly), and each run is compared with the same
reference (gates as they fall, which on a CPU is the fallback). A variant that
computes something else than the reference fails the check. report["checked"] lists
every (region, variant) compared and its result.
"""

from __future__ import annotations

import networkx as nx
import torch

from planner.graph import build_graph
from planner.ops import ARITH_OPS
from planner.pipeline import compile_plan

from ..dtypes import torch_dtype
from ..lowering import build_executor, default_schedule
from .externs import default_externs

__all__ = ["make_data", "pick_dims", "run_check", "compile_for_run", "computed_in", "tolerance", "outputs_match",
           "ARITH_KINDS", "TOLERANCE"]

ARITH_KINDS = ARITH_OPS
# fp8 outputs (quantize) are compared as their fp32 values: one e4m3 step is 2^-3 relative
TOLERANCE = {"bf16": (2e-2, 2e-2), "fp16": (5e-3, 5e-3), "fp32": (1e-4, 1e-4),
             "fp8_e4m3": (0.125, 1e-2), "fp8_e5m2": (0.25, 1e-2)}


def pick_dims(plan, num_tokens: int | None, seed: int, dims: dict | None = None) -> dict:
    """Values of the plan's dims for one run: `dims` (name -> value, `planner run --dim`) and
    num_tokens where given (checked against the declared range), the rest drawn from `seed`."""
    from planner.errors import PlanError, did_you_mean

    fixed = dict(dims or {})
    if num_tokens is not None:
        fixed["num_tokens"] = num_tokens
    for name, v in fixed.items():
        d = plan.dims.get(name)
        if d is None:
            flag = "--num-tokens" if name == "num_tokens" and num_tokens is not None else f"--dim {name}"
            hint = did_you_mean(name, list(plan.dims)) or (f"set one with --dim {next(iter(plan.dims))}=N"
                                                           if plan.dims else None)
            raise PlanError.at(None, "name", f"{flag}: the plan has no dim '{name}'"
                               f" (dims: {', '.join(plan.dims) or 'none'})", hint)
        if not d.lo <= v <= d.hi:
            flag = "--num-tokens" if name == "num_tokens" else f"--dim {name}"  # the CLI takes both alike
            raise PlanError.at(None, "param", f"{flag} {v} is outside {d.lo}..{d.hi}")
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, d in plan.dims.items():
        if name in fixed:
            out[name] = fixed[name]
        else:
            hi = min(d.hi, max(d.lo, 64))
            out[name] = int(torch.randint(d.lo, hi + 1, (1,), generator=g))
    return out


# ops whose int results are values of their inputs, moved or cast (positions through them keep their range)
_MOVES = {"copy", "slice", "view", "split", "cat", "pad", "shard", "all_gather", "all_to_all", "select"}


def _int_bounds(plan, bindings: dict) -> dict[str, int]:
    """int input -> an exclusive bound for its random values where an op needs one: rope positions
    index rows of their cos/sin cache (through any copies, casts, views, cuts and gathers of the
    input), so the positions drawn span the whole cache."""
    from planner.expr import eval_int
    by_id = {op.id: op for op in plan.ops}

    def roots(n):
        todo, seen, found = [n], {n}, []
        while todo:
            m = todo.pop()
            t = plan.tensors.get(m)
            op = by_id.get(t.producer) if t is not None else None
            if op is None:
                found.append(m)
                continue
            if op.op not in _MOVES:
                continue
            for x in op.inputs():
                if x not in seen:
                    seen.add(x)
                    todo.append(x)
        return found
    out: dict[str, int] = {}
    for op in plan.ops:
        if op.op == "rope" and op.cos_sin_cache in plan.tensors:
            rows = eval_int(plan.tensors[op.cos_sin_cache].shape[0], bindings)
            for n in roots(op.positions):
                out[n] = max(1, min(out.get(n, rows), rows))
    return out


def make_data(plan, bindings: dict, seed: int, rank: int, device, same_weights: bool = False) -> tuple[dict, dict]:
    """Seeded inputs (differ per rank: they are shards) and weights (scaled 1/sqrt(K)): per rank as
    TP shards are, or with same_weights the same on every rank (replicated weights)."""
    from planner.expr import eval_int
    gi = torch.Generator().manual_seed(seed * 7919 + rank)
    gw = torch.Generator().manual_seed(seed * 7919 + 104729) if same_weights else gi
    high = _int_bounds(plan, bindings)
    inputs, weights = {}, {}
    for names, out, g in ((plan.inputs, inputs, gi), (plan.weights, weights, gw)):
        for n in names:
            spec = plan.tensors[n]
            shape = tuple(eval_int(d, bindings) for d in spec.shape)
            dt = torch_dtype(spec.dtype)
            if dt.is_floating_point:
                t = torch.randn(shape, generator=g)
                if out is weights and len(shape) == 2 and shape[1] > 0:
                    t = t / shape[1] ** 0.5
            else:  # non-negative: int inputs are positions, ids or counts
                t = torch.randint(0, high.get(n, 8), shape, generator=g)
            out[n] = t.to(dt).to(device)
    return inputs, weights


def compile_for_run(plan, config=None):
    """The plan through planner.pipeline.compile_plan, ready for build_executor."""
    return compile_plan(plan, config)


def reference_compiled(plan):
    cp = build_graph(plan)
    for v in cp.graph.nodes:
        cp.graph.nodes[v]["stream"] = "main"
    cp.schedule = default_schedule(cp)
    return cp


# casts that keep every value (wider formats)
_EXACT_CASTS = {(a, "fp32") for a in ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2")} | \
    {(a, b) for a in ("fp8_e4m3", "fp8_e5m2") for b in ("bf16", "fp16")}


def computed_in(ref_cp) -> dict[str, list[str]]:
    """output -> the dtypes its arithmetic ancestors rounded to ([] when only data movement made it).

    An output made by bf16 arithmetic and then cast to fp32 was computed in bf16: fusion or
    another reduction order may move it by a bf16 rounding, whatever dtype it is returned in.
    A cast (copy to another dtype) rounds to its dtype: a variant that sends fp8 over the wire
    differs from one that sends bf16 by an fp8 step.
    """
    g = ref_cp.graph
    tensors = ref_cp.tensors

    def rounds(op) -> bool:  # arithmetic, or a copy that casts to a narrower format (to fp8: one fp8 step)
        if op.op in ARITH_KINDS:
            return True
        if op.op != "copy" or op.dtype is None or op.dtype == tensors[op.x].dtype:
            return False
        return (tensors[op.x].dtype, op.dtype) not in _EXACT_CASTS
    out = {}
    for o in ref_cp.plan.outputs:
        p = tensors[o].producer
        anc = nx.ancestors(g, p) | {p} if p is not None else set()
        out[o] = sorted({tensors[n].dtype for v in anc if rounds(g.nodes[v]["op"]) for n in g.nodes[v]["op"].out})
    return out


def _exactness(ref_cp) -> dict[str, bool]:
    """output -> True when only data movement produced it."""
    return {o: not d for o, d in computed_in(ref_cp).items()}


def tolerance(dtypes: list[str]) -> tuple[float, float] | None:
    """(rtol, atol) for an output computed in `dtypes`: the loosest of them; None = bit-exact."""
    if not dtypes:
        return None
    tols = [TOLERANCE.get(d, (1e-2, 1e-2)) for d in dtypes]
    return max(t[0] for t in tols), max(t[1] for t in tols)


def outputs_match(a, r, tol: tuple[float, float] | None, normwise: bool = False) -> bool:
    """Bit-exact (tol None) or allclose, NaNs equal where both have them. normwise (an fp8
    variant against a reference that took another path): also accepted when every row (token)
    holds ||a - r|| <= rtol / 2 ||r|| + atol sqrt(n): a block-scaled fp8 error is relative to its
    block's magnitude rather than to each element, and half of fp8's step bounds its rms; a
    dropped, zeroed or rescaled row or block is far outside that."""
    if tol is None:
        return bool(torch.equal(a, r)) or bool(((a == r) | (a.isnan() & r.isnan())).all()
                                                if a.is_floating_point() and a.shape == r.shape else False)
    af, rf = a.float(), r.float()
    if torch.allclose(af, rf, rtol=tol[0], atol=tol[1], equal_nan=True):
        return True
    if not normwise or bool((af.isnan() ^ rf.isnan()).any()):
        return False
    if af.dim() == 0:
        af, rf = af.reshape(1), rf.reshape(1)
    d = torch.nan_to_num(af - rf).reshape(-1, af.shape[-1])
    ref = torch.nan_to_num(rf).reshape(-1, af.shape[-1])
    bound = tol[0] / 2 * ref.norm(dim=1) + tol[1] * max(af.shape[-1], 1) ** 0.5
    return bool((d.norm(dim=1) <= bound).all())


def forced_runs(cp) -> list[dict]:
    """One forcing per variant name: that variant in every live region that has it, and the
    variants those regions sit in (so a nested variant runs) where that forces no region two ways.
    A region inside a variant the compile removed is not live."""
    def live(o, v):
        return any(x.name == v for x in cp.variants.get(o, ()))
    regions = {r: vs for r, vs in cp.variants.items() if all(live(o, v) for o, v in cp.plan.regions[r].within)}
    names: list[str] = []
    for vs in regions.values():
        for v in vs:
            if v.name not in names:
                names.append(v.name)
    out = []
    for n in names:
        f = {r: n for r, vs in regions.items() if any(v.name == n for v in vs)}
        for r in list(f):
            within = cp.plan.regions[r].within
            if all(f.get(o, v) == v for o, v in within):
                f.update(within)
        out.append(f)
    return out


def _compare(plan, outs, routs, precision, forced: bool = False) -> tuple[bool, list[dict]]:
    """forced: a variant forced against the reference's own choice (an fp8 variant against a bf16
    fallback differs by fp8's rounding): fp8-rounded outputs may also match norm-wise."""
    ok, entries = True, []
    for n in plan.outputs:
        a, r = outs[n], routs[n]
        tol = tolerance(precision[n])
        entry = {"name": n, "shape": list(a.shape), "dtype": str(a.dtype).replace("torch.", ""), "exact": tol is None,
                 "computed_in": precision[n]}
        if a.shape != r.shape or a.dtype != r.dtype:
            entry.update(max_abs_err=float("inf"), ok=False,
                         why=f"compiled {tuple(a.shape)} {a.dtype} vs reference {tuple(r.shape)} {r.dtype}")
        else:
            diff = (a.float() - r.float()).abs()
            entry["max_abs_err"] = float(diff.max()) if diff.numel() else 0.0
            entry["ok"] = outputs_match(a, r, tol, normwise=forced and any(d.startswith("fp8") for d in precision[n]))
        ok &= entry["ok"]
        entries.append(entry)
    return ok, entries


def run_check(load, *, rank: int = 0, num_tokens: int | None = None, seed: int = 0, device="cpu",
              group=None, backend_prefs=None, externs=None, compare: bool = True, config=None,
              tuning: dict | None = None, every_variant: bool = True, dims: dict | None = None,
              same_weights: bool = False) -> dict:
    """load() -> a fresh Plan (called twice: compile passes rewrite ops in place)."""
    plan = load()
    ref_plan = load()
    b = pick_dims(plan, num_tokens, seed, dims)
    inputs, weights = make_data(plan, b, seed, rank, device, same_weights)
    ext = dict(externs or {})
    ext.update(default_externs(plan, ext))
    cp = compile_for_run(plan, config)
    ex = build_executor(cp, weights, group=group, device=device, externs=ext, backend_prefs=backend_prefs,
                        tuning=tuning)
    outs = ex(dims=b, **inputs)
    report = {"plan": plan.name, "rank": rank, "dims": b, "variants": dict(ex.last_variants),
              "passes": list(getattr(cp, "passes_run", [])), "outputs": [], "ok": True,
              "backends": sorted({v for v in ex.backends.values() if v})}
    if not compare:
        report["outputs"] = [{"name": n, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                              "max_abs_err": None, "ok": None, "exact": None} for n, t in outs.items()]
        return report
    rcp = reference_compiled(ref_plan)
    # the reference takes the tuning's limits (the same variants) but none of its backends: torch
    ref = build_executor(rcp, weights, group=group, device=device, externs=ext, backend_prefs=("torch",),
                         tuning={"limits": dict(ex.tuned)})
    routs = ref(dims=b, **inputs)
    report["ref_variants"] = dict(ref.last_variants)
    precision = computed_in(rcp)
    ok, report["outputs"] = _compare(plan, outs, routs, precision)
    report["ok"] = ok
    both = set(report["variants"]) & set(report["ref_variants"])
    if any(report["variants"][r] != report["ref_variants"][r] for r in both):
        report["ok"] = False
        report["why"] = "compiled and reference took different variants"
    report["checked"] = [{"forced": None, "variants": dict(ex.last_variants), "ok": ok,
                          "bad": [e["name"] for e in report["outputs"] if not e["ok"]]}]
    if every_variant:
        def forced_run(entry: dict, what: str) -> None:
            """One call with what ex is forced to run (a variant, a range's stream plan), checked."""
            fouts = ex(dims=b, **{k: v.clone() for k, v in inputs.items()})
            fok, entries = _compare(plan, fouts, routs, precision, forced=entry.get("forced") is not None)
            bad = [e["name"] for e in entries if not e["ok"]]
            unreached = sorted(r for r in entry.get("forced") or {} if r not in ex.last_variants)
            report["checked"].append({**entry, "variants": dict(ex.last_variants), "ok": fok, "bad": bad,
                                      "unreached": unreached,
                                      "max_abs_err": max((e["max_abs_err"] for e in entries), default=0.0)})
            if not fok:
                report["ok"] = False
                msg = f"{what} (forced) computes something else: {', '.join(bad)}"
                report["why"] = f"{report['why']}; {msg}" if report.get("why") else msg

        for forced in forced_runs(cp):
            ex.forced = forced
            try:
                forced_run({"forced": forced}, f"variant '{next(iter(forced.values()))}'")
            finally:
                ex.forced = {}
        # every per-range stream plan (planner/passes/bucket_plans.py) at these dims: the same ops
        # on other streams with other events must compute the same
        ran = ex.last_piece
        for i, (d, lo, hi) in enumerate(ex.pieces):
            if i == ran:
                report["checked"][0]["stream_plan"] = f"{d} {lo}..{hi}"
                continue
            ex.forced_piece = i
            try:
                forced_run({"forced": None, "stream_plan": f"{d} {lo}..{hi}"}, f"the stream plan of {d} {lo}..{hi}")
            finally:
                ex.forced_piece = None
    return report
