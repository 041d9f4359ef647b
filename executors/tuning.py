"""Apply a tuning file's measured backends to the lowered gemm steps of an Executor."""

from __future__ import annotations

from planner.expr import eval_int
from planner.tuning import load_tuning, parse_signature

from .backends.gemm import gemm_runner
from .dtypes import torch_dtype

__all__ = ["apply_tuning", "static_int"]


def static_int(d, params):
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
        n, k = static_int(w_spec.shape[0], params), static_int(w_spec.shape[1], params)
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
    return count
