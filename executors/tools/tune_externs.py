"""`planner tune --externs`: the time of every model-code site of a plan, per dim bucket.

A plan's externs carry a declared `cost_us` (one number for every size) or none at all, so
the stream planner rates model code by a guess. Given the caller's implementations (the
same mapping build_executor takes), each extern site is timed at every bucket with fresh
random inputs of its declared shapes, through the executor's own extern call (shape and
dtype of every result checked), in CUDA-graph replays rotating `nsets` input sets. The time
goes to the tuning file's "measured" under the site's signature
(extern:FN:M=<rows>,<inputs>-><results>, planner.cost.op_signature), which the cost model
reads in place of `cost_us` at that size. Model code that cannot be captured in a graph is
reported and keeps its declared cost.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

from ..backends.registry import impl_of
from ..lowering import resolve_device
from .tune_ops import keyed_ops

__all__ = ["extern_sites", "tune_externs", "load_externs"]


def extern_sites(cp, dim: str, buckets: list) -> dict:
    """{signature: (op, input specs, bindings)} of every extern of the compiled plan per bucket."""
    return keyed_ops(cp, dim, buckets, want=lambda op: op.op == "extern")


def tune_externs(cp, dim: str, buckets: list, res: dict, externs: dict, device: str = "cuda", iters=20,
                 trials=5, nsets=4, log=None) -> int:
    """Time every extern site of `cp` whose function `externs` binds; record "measured"."""
    from .timing import time_graphs
    sites = extern_sites(cp, dim, buckets)
    done = 0
    for i, (sig, (op, specs, bind)) in enumerate(sorted(sites.items())):
        if op.fn not in externs:
            if log:
                log(f"[tune] ({i + 1}/{len(sites)}) {sig}: no implementation of '{op.fn}' given; keeps its cost_us")
            continue
        bctx = SimpleNamespace(params=cp.plan.params, extern=externs.__getitem__, device=resolve_device(device, {}))
        run = impl_of("extern", "torch").make(op, bctx)
        sets = _input_sets(specs, bind, nsets, device)
        b = {d: bind[d] for d in cp.plan.dims}
        try:
            run(sets[0], b, None)  # shapes and dtypes of the results are checked by the call
            us = time_graphs({"extern": lambda k, run=run, sets=sets, b=b: run(sets[k % nsets], b, None)},
                             iters=iters, trials=trials,
                             nsets=nsets)["extern"]
        except Exception as exc:  # noqa: BLE001 - user code that cannot be timed keeps its declared cost
            if log:
                log(f"[tune] ({i + 1}/{len(sites)}) {sig}: not timed ({type(exc).__name__}: {str(exc)[:160]});"
                    f" keeps its cost_us")
            continue
        res["measured"][sig] = round(us, 3)
        done += 1
        if log:
            log(f"[tune] ({i + 1}/{len(sites)}) {sig}: {us:.2f} us (declared cost_us {op.cost_us})")
    return done


SHARED_BYTES = 64 << 20  # inputs this large (expert weights) are one tensor in every set: beyond L2 anyway


def _input_sets(specs, bind, nsets: int, device) -> list[list]:
    """`nsets` sets of random inputs made on the device (floats ~N(0,1), ints in 0..7: positions,
    ids, counts); an input of SHARED_BYTES or more is shared by every set."""
    import torch

    from planner.expr import eval_int

    from ..dtypes import torch_dtype
    gen = torch.Generator(device=device).manual_seed(31)
    sets = [[] for _ in range(nsets)]
    for s in specs:
        shape = tuple(eval_int(d, bind) for d in s.shape)
        dt = torch_dtype(s.dtype)
        big = dt.itemsize * int(torch.Size(shape).numel()) >= SHARED_BYTES
        shared = None
        for k in range(nsets):
            if shared is None or not big:
                if dt.is_floating_point:
                    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dt)
                else:
                    t = torch.randint(0, 8, shape, generator=gen, device=device).to(dt)
                shared = t
            sets[k].append(shared)
    return sets


def load_externs(spec: str) -> dict:
    """'package.module:NAME' -> the extern mapping NAME is (a dict) or returns (a callable with no
    arguments). ValueError with a clear message when it cannot be loaded."""
    mod, sep, attr = spec.partition(":")
    if not sep or not mod or not attr:
        raise ValueError(f"--externs '{spec}': expected MODULE:NAME (e.g. executors.tools.externs:model_externs)")
    try:
        obj = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--externs '{spec}': {type(exc).__name__}: {exc}") from None
    got = obj() if callable(obj) and not isinstance(obj, dict) else obj
    if not isinstance(got, dict) or not all(isinstance(k, str) and callable(v) for k, v in got.items()):
        raise ValueError(f"--externs '{spec}': must be (or return) a dict of function name -> callable")
    return got
