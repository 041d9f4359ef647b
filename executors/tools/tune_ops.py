"""`planner tune` for the ops keyed by planner.cost.signature_key: the memory-bound ops
(rmsnorm, add_rmsnorm, silu_and_mul, gelu_and_mul, rope, quantize) and scaled fp8 gemms.

Per signature (op kind, dtype, static shape; one per dim bucket) every registered backend
whose capability check passes here is a candidate, torch first. Each is checked against an
fp32 reference on fresh random inputs (outputs it writes into are poisoned with NaN first),
then timed with the bf16 gemms' CUDA-graph replays (executors.tools.tune.time_graphs: `nsets`
input sets rotated so L2 does not flatter). The fastest correct candidate is recorded in the
tuning file's "backends" (torch wins ties and whenever nothing beats it), its time in
"measured", every candidate's time in "candidates"; executors.tuning.apply_tuning applies
them per M.
"""

from __future__ import annotations

from types import SimpleNamespace

from planner.cost import TUNABLE_KINDS, op_signature

from ..backends.registry import impl_of

__all__ = ["keyed_ops", "op_candidates", "op_inputs", "reference", "time_op", "tune_keyed"]


def _is_keyed(op) -> bool:
    return op.op in TUNABLE_KINDS or (op.op == "gemm" and getattr(op, "scaled", False))


def keyed_ops(cp, dim: str, buckets: list, want=_is_keyed) -> dict:
    """{signature: (op, input specs, bindings)} of every op of the compiled plan that `want`
    picks (default: the keyed ops), per bucket."""
    g = cp.graph
    out = {}
    for v in cp.schedule or list(g.nodes):
        op = g.nodes[v]["op"]
        if not want(op):
            continue
        specs = [cp.tensors[n] for n in op.inputs()]
        outs = [cp.tensors[n] for n in op.out if n in cp.tensors]
        for b in buckets:
            bind = {**cp.plan.params, **{d: cp.plan.dims[d].hi for d in cp.plan.dims}, dim: b}
            out.setdefault(op_signature(op, specs, bind, outs), (op, specs, bind))
    return out


def op_candidates(op, specs, device: str) -> list[str]:
    """Backends registered for op's kind that can run it here; torch first."""
    from ..backends import backends_for
    out = ["torch"]
    for be in backends_for(op.op):
        if be == "torch" or (op.op == "gemm" and be == "flashinfer"):  # plain "flashinfer" = one of the named ones
            continue
        try:
            why = impl_of(op.op, be).supports(op, specs, device)
        except Exception as exc:  # noqa: BLE001 - a failing checker means "cannot run"
            why = str(exc)
        if why is None:
            out.append(be)
    return out


def op_inputs(op, specs, bind, seed: int, device):
    """Random inputs for one op call: floats ~N(0,1), fp8 from N(0,1), positive fp32 scales for
    fp8 gemms, positions inside the cos/sin cache."""
    import torch

    from planner.expr import eval_int

    from ..dtypes import torch_dtype
    g = torch.Generator().manual_seed(seed)
    names = op.inputs()
    out = []
    for n, s in zip(names, specs, strict=True):
        shape = tuple(eval_int(d, bind) for d in s.shape)
        dt = torch_dtype(s.dtype)
        if op.op == "gemm" and n in (op.scale_a, op.scale_b):
            t = torch.rand(shape, generator=g) * 0.02 + 0.005
        elif dt.is_floating_point:
            t = torch.randn(shape, generator=g)
        else:
            hi = eval_int(specs[names.index(op.cos_sin_cache)].shape[0], bind) if op.op == "rope" else 8
            t = torch.randint(0, hi, shape, generator=g)
        out.append(t.to(dt).to(device))
    return out


def reference(op, specs, ins):
    """fp32 results of op (a list), from the torch implementations on fp32 copies."""
    import torch

    from ..backends.torch_fp8 import gemm_fp8_reference, kinds_of, quantize_reference
    from ..backends.torch_pointwise import add_rmsnorm_ref, gated_ref, rmsnorm_ref, rope_ref
    f = [t.float() if t.dtype.is_floating_point else t for t in ins]
    k = op.op
    if k == "gemm":
        ka, kb = kinds_of(op, specs)
        return [gemm_fp8_reference(*ins, ka, kb, torch.float32)]
    if k == "rmsnorm":
        return [rmsnorm_ref(f[0], f[1], op.eps)]
    if k == "add_rmsnorm":
        return add_rmsnorm_ref(f[0], f[1], f[2], op.eps)
    if k in ("silu_and_mul", "gelu_and_mul"):
        return [gated_ref(f[0], "silu" if k == "silu_and_mul" else "gelu", getattr(op, "approximate", "none"))]
    if k == "rope":
        return rope_ref(f[0], f[1], ins[2], f[3], op.interleave)
    if k == "quantize":
        from ..dtypes import torch_dtype
        q, s = quantize_reference(ins[0], torch_dtype(op.dtype), op.block[1])
        return [q.float(), s]
    raise ValueError(f"no reference for {k}")


def _err(got, ref) -> float:
    import torch
    o = got.float()
    if not bool(torch.isfinite(o).all()):
        return float("inf")
    return float((o - ref).norm() / ref.norm().clamp_min(1e-30))


def time_op(op, specs, bind, cands, iters=20, trials=5, nsets=4, log=None, dev="cuda") -> dict:
    """{backend: us | None}: None where the candidate failed or disagreed with the reference."""
    import torch

    from .timing import time_graphs
    bctx = SimpleNamespace(specs=dict(zip(op.inputs(), specs, strict=True)), params=bind, device=dev)
    sets = [op_inputs(op, specs, bind, seed=11 + i, device=dev) for i in range(nsets)]
    ref = reference(op, specs, sets[0])
    fns, res = {}, {}
    inplace = getattr(op, "inplace", False)
    for be in cands:
        try:
            run = impl_of(op.op, be).make(op, bctx)
            ins = [t.clone() for t in sets[0]]
            poisoned = None
            if op.op in ("rmsnorm", "silu_and_mul", "gelu_and_mul", "gemm"):
                shape = tuple(ref[0].shape)
                poisoned = torch.full(shape, float("nan"), device=dev, dtype=_out_dtype(op, ins))
            got = run(ins, bind, poisoned)
            got = got if isinstance(got, list) else [got]
            if dev != "cpu":
                torch.cuda.synchronize()
            if op.op == "quantize":  # the dequantized values (q * scale) are what consumers see
                deq = got[0].float() * got[1].repeat_interleave(op.block[1], 1)
                want = ref[0] * ref[1].repeat_interleave(op.block[1], 1)
                errs = [_err(deq, want)]
                tol = 0.08  # one e4m3 step is 2^-3 relative; the error norm stays well below it
            else:
                errs = [_err(g_, r_) for g_, r_ in zip(got, ref, strict=True)]
                tol = 2e-2
            if not max(errs) < tol:
                raise AssertionError(f"rel err {max(errs):.2e} (tolerance {tol})")
        except Exception as exc:  # noqa: BLE001 - a broken candidate is reported and skipped
            res[be] = None
            if log:
                log(f"    {be}: skipped ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        outs = [torch.empty_like(ref[0], dtype=_out_dtype(op, sets[0])) for _ in range(nsets)] \
            if op.op in ("rmsnorm", "silu_and_mul", "gelu_and_mul", "gemm") else [None] * nsets
        work = [[t.clone() for t in s] for s in sets] if inplace else sets
        fns[be] = (lambda i, run=run, work=work, outs=outs: run(work[i % nsets], bind, outs[i % nsets]))
    if fns:
        res.update(time_graphs(fns, iters=iters, trials=trials, nsets=nsets))
    return res


def _out_dtype(op, ins):
    import torch

    from ..dtypes import torch_dtype
    if op.op == "gemm":
        return torch_dtype(op.out_dtype or "bf16")
    return ins[0].dtype if ins[0].dtype.is_floating_point else torch.float32


def tune_keyed(cp, dim: str, buckets: list, res: dict, device: str = "cuda", iters=20, trials=5, nsets=4,
               log=None) -> int:
    """Time every keyed op signature of `cp` and record the choices in the tuning dict `res`."""
    sigs = keyed_ops(cp, dim, buckets)
    for i, (sig, (op, specs, bind)) in enumerate(sorted(sigs.items())):
        cands = ["torch"] if device == "cpu" else op_candidates(op, specs, device)
        times = time_op(op, specs, bind, cands, iters=iters, trials=trials, nsets=nsets, log=log, dev=device)
        ok = {b: us for b, us in times.items() if us is not None}
        if not ok:
            if log:
                log(f"[tune] {sig}: no candidate computed the right result")
            continue
        best = min(ok, key=lambda b: (ok[b], b != "torch"))
        res["backends"][sig] = {"backend": best, "config": None}
        res["measured"][sig] = round(ok[best], 3)
        res.setdefault("candidates", {})[sig] = {b: (None if us is None else round(us, 3)) for b, us in times.items()}
        if log:
            log(f"[tune] ({i + 1}/{len(sigs)}) {sig}: best {best} {ok[best]:.2f} us"
                f" (torch {ok.get('torch', float('nan')):.2f} us)")
    return len(sigs)
