"""Tuning at build time: which tuning applies (resolve_tuning) and the tuned gemm runners.

build_executor resolves its `tuning=` argument once (a file, a full-format dict, a dict of
limits, {} for none, or None: the shipped tuning that matches this device, planner/tuned/),
and lowering builds each gemm step with its tuned runner (tuned_gemm): the backend choice is
made once, from the registry and this table, and shows in ex.backends. apply_tuning re-lowers
the gemm steps of an executor the tuner is measuring (executors.tools.tune refinements).
"""

from __future__ import annotations

import os

import torch

from planner.errors import PlanError, read_json
from planner.expr import eval_int
from planner.tuning import (
    ALL_KEYS,
    check_limits,
    check_variants,
    gemm_shapes,
    load_tuning,
    match_tuning,
    parse_signature,
    validate_tuning,
)

from .backends.gemm import gemm_runner
from .backends.registry import impl_of
from .dtypes import torch_dtype
from .errors import BuildError

__all__ = ["apply_tuning", "check_backends", "static_int", "resolve_tuning", "gemm_table", "tuned_gemm", "device_key"]


def static_int(d, params):
    try:
        return int(eval_int(d, params))
    except Exception:  # noqa: BLE001 - symbolic in a dim: not tunable statically
        return None


def device_key(device) -> tuple[str, int | None, dict | None]:
    """(device name, compute capability, {library: version}) a shipped tuning is matched on."""
    if device.type != "cuda":
        return device.type, None, None
    major, minor = torch.cuda.get_device_capability(device)
    return torch.cuda.get_device_name(device), major * 10 + minor, {"torch": torch.__version__}


def resolve_tuning(cp, tuning, device) -> tuple[dict, str]:
    """(full-format tuning dict, source line) for build_executor's `tuning=`.

    str: a tuning file (strict: unknown keys and undeclared limits are errors naming the file
    and key); a dict with format keys: the same checks; a dict without: {limit: int}; {}: none;
    None: the shipped tuning matching this device and plan, else none with a one-line note."""
    plan = cp.plan
    if tuning is None:
        name, cc, versions = device_key(device)
        data, source = match_tuning(name, plan.tuned, gemm_shapes(plan), cc, versions)
        return (data or {}), source
    where = "tuning="
    if isinstance(tuning, (str, os.PathLike)):
        where = tuning = os.fspath(tuning)
        try:
            tuning = read_json(tuning, "tuning file")
        except PlanError as exc:  # unreadable, not JSON, a repeated key, too deep, a number too long
            raise BuildError(str(exc)) from None
    if not isinstance(tuning, dict):
        raise BuildError(f"tuning= must be a file path, a tuning dict or {{limit: int}}, got {type(tuning).__name__}")
    if not tuning:
        return {}, "none (tuning={}): plan defaults" if where == "tuning=" else f"{where} (empty): plan defaults"
    if where == "tuning=" and not any(k in ALL_KEYS for k in tuning):
        for k, v in tuning.items():  # the in-code shorthand {limit: int}
            if k not in plan.tuned:
                raise BuildError(f"tuning sets '{k}' but the plan declares tuned limits {sorted(plan.tuned)}")
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise BuildError(f"tuning['{k}'] must be a non-negative integer limit, got {v!r:.60}")
        return {"limits": {k: int(v) for k, v in tuning.items()}}, "tuning= (limits " + ", ".join(
            f"{k}={v}" for k, v in tuning.items()) + ")"
    try:
        data = check_limits(load_tuning(tuning) if where == "tuning=" else validate_tuning(tuning, where),
                            plan.tuned, where, plan.name)
        check_variants(data, plan.regions, where, plan.name)
    except ValueError as exc:
        raise BuildError(str(exc)) from None
    check_backends(data, where)
    return data, (where if where != "tuning=" else "tuning= (dict)")


def check_backends(data: dict, where: str) -> None:
    """Every backend a tuning names must be registered for its op kind: the planner checks only
    the family (flashinfer), the registry knows the sub-backends (flashinfer:cudnn). where: the
    file, prefixed to the message ("" where the caller locates the error)."""
    from planner.cost import split_signature

    from .backends import backends_for
    for sig, entry in (data.get("backends") or {}).items():
        kind = split_signature(sig)[0]
        known = backends_for(kind)
        if entry["backend"] not in known:
            msg = (f"backends['{sig}'].backend '{entry['backend']:.60}' is not a {kind} backend"
                   f" (known: {', '.join(sorted(known))})")
            raise BuildError(f"{where}: {msg}" if where else msg)



def gemm_table(tuning: dict) -> dict:
    """{(dtype, N, K): {M: backend entry}} of a tuning's "backends"."""
    by_shape: dict = {}
    for sig, entry in (tuning.get("backends") or {}).items():
        p = parse_signature(sig)
        if p is None:
            continue
        dtype, m, n, k = p
        by_shape.setdefault((dtype, n, k), {})[m] = entry
    return by_shape


def _cannot_run(backend: str, op, specs, device: str) -> str | None:
    """Why a tuned backend cannot run op here (its library absent, a CPU, an older GPU), or None:
    the registry's capability check of that backend. A tuning measured elsewhere may name one:
    its sizes then run the registry's choice instead of failing at the first call."""
    impl = impl_of(op.op, backend)
    if impl is None:
        return None  # an unknown name is the runner's error (check_backends names it first)
    try:
        return impl.supports(op, specs, device)
    except Exception as exc:  # noqa: BLE001 - a failing checker means "cannot run"
        return f"capability check failed: {exc}"


def tuned_gemm(op, a_spec, w_spec, params, table: dict, fallback, device: str = "cuda"):
    """(runner, backend label) of a bf16 gemm op with tuned entries for its (dtype, N, K), or None.
    A call with M uses the entry of the smallest tuned M >= M (the bucket its graph was
    captured at); above every tuned M, `fallback` (the registry's choice) runs. Scaled fp8
    gemms are keyed like the pointwise ops (tuned_keyed)."""
    if not table or getattr(op, "backend", "auto") not in (None, "auto") or getattr(op, "scaled", False):
        return None  # an explicitly named backend wins over tuning
    n, k = static_int(w_spec.shape[0], params), static_int(w_spec.shape[1], params)
    entries = table.get((a_spec.dtype, n, k))
    if not entries or op.out_dtype not in (None, a_spec.dtype):
        return None
    dt = torch_dtype(op.out_dtype or a_spec.dtype)
    missing = {b: _cannot_run(b, op, [a_spec, w_spec], device) for b in {e["backend"] for e in entries.values()}}
    usable = {m: e for m, e in entries.items() if missing[e["backend"]] is None}
    if not usable:
        return None
    runners = {m: gemm_runner(e["backend"], e.get("config"), dt) for m, e in usable.items()}
    ms = sorted(entries)
    maxm = ms[-1]
    fb = lambda a, w, out: fallback((a, w), None, out)  # noqa: E731 - sizes whose backend is absent here
    lut = [runners.get(next(x for x in ms if x >= mm), fb) for mm in range(maxm + 1)]

    def run(ins, b, out, lut=lut, maxm=maxm, orig=fallback):
        m = ins[0].shape[0]
        if m > maxm:
            return orig(ins, b, out)
        return lut[m](ins[0], ins[1], out)
    label = "tuned:" + ",".join(sorted({e["backend"] for e in usable.values()}))
    gone = sorted(b for b, why in missing.items() if why)
    return run, label + (f" ({', '.join(gone)} cannot run here: the registry's choice there)" if gone else "")


def keyed_table(tuning: dict) -> dict:
    """{(kind, dtype, signature less M): {M: backend entry}} for pointwise ops and scaled fp8
    gemms (planner.cost.signature_key)."""
    from planner.cost import TUNABLE_KINDS, split_signature
    by_key: dict = {}
    for sig, entry in (tuning.get("backends") or {}).items():
        p = split_signature(sig)
        if p is not None and (p[0] in TUNABLE_KINDS or (p[0] == "gemm" and ",sa=" in p[3])):
            by_key.setdefault((p[0], p[1], p[3]), {})[p[2]] = entry
    return by_key


def tuned_keyed(op, specs, params, dims, table: dict, fallback, bctx):
    """(runner, backend label) of a pointwise op or scaled gemm with tuned entries, or None:
    the registry's implementation of the tuned backend per M; calls past the largest tuned M
    run `fallback`."""
    from planner.cost import TUNABLE_KINDS, signature_key

    if not table or getattr(op, "backend", "auto") not in (None, "auto"):
        return None  # an explicitly named backend wins over tuning
    if op.op not in TUNABLE_KINDS and not (op.op == "gemm" and getattr(op, "scaled", False)):
        return None
    entries = table.get(signature_key(op, specs, {**params, **{d: 1 for d in dims}}))
    if not entries:
        return None
    made, gone = {}, set()
    for e in entries.values():
        impl = impl_of(op.op, e["backend"])
        if impl is None:
            raise BuildError(f"tuning names backend '{e['backend']}' for {op.op}, which has none of that name")
        if e["backend"] in made or e["backend"] in gone:
            continue
        if _cannot_run(e["backend"], op, specs, bctx.device.type) is not None:  # measured where it ran; not here
            gone.add(e["backend"])
            continue
        made[e["backend"]] = impl.make(op, bctx)
    if not made:
        return None
    ms = sorted(entries)
    lut = [made.get(entries[next(x for x in ms if x >= mm)]["backend"], fallback) for mm in range(ms[-1] + 1)]

    def run(ins, b, out, lut=lut, orig=fallback):
        m = ins[0].shape[0]
        return orig(ins, b, out) if m >= len(lut) else lut[m](ins, b, out)
    return run, "tuned:" + ",".join(sorted(made)) + (f" ({', '.join(sorted(gone))} cannot run here: the registry's"
                                                     " choice there)" if gone else "")


def apply_tuning(ex, tuning) -> int:
    """Re-lower the tunable steps of a built Executor with `tuning`'s backends (the tuner's
    refinement loop); returns how many steps took a tuned runner. gemm_chain ops keep
    their kernel. build_executor does not call this: lowering builds tuned steps directly."""
    from types import SimpleNamespace
    data = load_tuning(tuning) if tuning is not None else {}
    check_backends(data, tuning if isinstance(tuning, str) else "tuning")
    table, keyed = gemm_table(data), keyed_table(data)
    if not table and not keyed:
        return 0
    params, g = ex.plan.params, ex.compiled.graph
    bctx = SimpleNamespace(specs=ex._specs, params=params, device=ex.device)
    count = 0
    for st in ex.every_step():  # per-range stream plans hold copies of the steps: rewire them too
        if st.run is None or st.kind == "gemm_chain":  # a gemm_chain keeps its fused kernel
            continue
        op = g.nodes[st.id]["op"]
        specs = [ex._specs[n] for n in op.inputs()]
        base = getattr(st, "base_run", None) or st.run
        got = tuned_keyed(op, specs, params, ex.plan.dims, keyed, base, bctx)
        if got is None and st.kind == "gemm":
            got = tuned_gemm(op, specs[0], specs[1], params, table, base, ex.device.type)
        if got is None:
            continue
        st.run, st.backend = got
        ex.backends[st.id] = st.backend
        count += 1
    return count
