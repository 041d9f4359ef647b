"""A plain-torch evaluation of a loaded Plan, straight from its ops: the property tests' oracle.

evaluate_plan(plan, bindings, per_rank_data, choice) runs every op of plan.ops in order, in float64,
for all W ranks at once (each env value is a list of W tensors), so a collective is just a cat or a
sum over that list. After every op the result is rounded to the op's declared dtype (what the
device stores) and carried on in float64. Independent of executors/: no backends, no lowering, no
schedule, no fusion; only planner's Plan and torch. `choice` is the variant each region takes.
"""

from __future__ import annotations

import zlib

import torch

from planner.expr import evaluate, parse

__all__ = ["evaluate_plan"]

_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _dim(v, env) -> int:
    if isinstance(v, int):
        return v
    return int(evaluate(parse(v), env))


def _round(t, dtype: str):
    dt = _DT.get(dtype)
    return t.to(dt).double() if dt is not None else t


def _extern(name: str, args, shape, dtype):
    # the documented stand-in of executors/tools/externs.py, re-derived: a seeded mix, then RMS-normalised
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    coeffs = ((torch.rand(64, generator=gen) + 0.5) * torch.where(torch.rand(64, generator=gen) > 0.5, 1.0, -1.0))
    n = 1
    for d in shape:
        n *= d
    mix = torch.zeros(n, dtype=torch.float64)
    for i, a in enumerate(args):
        flat = a.reshape(-1)
        if flat.numel() == 0:
            continue
        if flat.numel() != n:
            flat = flat[torch.arange(n) % flat.numel()]
        mix += float(coeffs[i % 64]) * _round(flat, "fp32")
    y = mix.view(tuple(shape))
    if y.dim() >= 1 and y.shape[-1] > 0:
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
    return _round(y, dtype)


def evaluate_plan(plan, bindings: dict, data: list[dict], choice: dict) -> dict:
    """data[r] = {input or weight name: tensor} of rank r -> {output: [tensor of rank r for r]}."""
    W = len(data)
    env = {n: [data[r][n].double() for r in range(W)] for n in list(plan.inputs) + list(plan.weights)}
    denv = {**plan.params, **bindings}
    specs = plan.tensors
    for op in plan.ops:
        ctx = plan.op_ctx.get(op.id, ())
        if any(choice.get(rid) != v for rid, v in ctx):
            continue
        k = op.op
        dtype = specs[op.out[0]].dtype if op.out and op.out[0] in specs else None
        if k == "select":
            names = list(op.variants) or [v.name for v in plan.regions[op.region].variants]
            env[op.out[0]] = env[op.choices[names.index(choice[op.region])]]
            continue
        if k in ("all_gather", "reduce_scatter", "all_reduce"):
            xs = env[op.x]
            if plan.groups[op.group] == 1:
                env[op.out[0]] = list(xs)
                continue
            red = {"sum": lambda ts: sum(ts[1:], ts[0]), "max": lambda ts: torch.stack(ts).amax(0),
                   "min": lambda ts: torch.stack(ts).amin(0)}
            if k == "all_gather":
                full = torch.cat(xs, op.dim)
                env[op.out[0]] = [full] * W
            elif k == "all_reduce":
                total = _round(red[op.reduce](xs), dtype)
                env[op.out[0]] = [total] * W
            else:
                total = _round(red[op.reduce](xs), dtype)
                env[op.out[0]] = list(torch.chunk(total, W, op.dim))
            continue
        outs = []
        for r in range(W):
            if k == "gemm":
                y = [_round(env[op.a][r] @ env[op.b][r].T, op.out_dtype or specs[op.a].dtype)]
            elif k == "add":
                y = [_round(env[op.a][r] + env[op.b][r], dtype)]
            elif k == "split":
                sizes = [_dim(s, denv) for s in op.sizes] if isinstance(op.sizes, list) else _dim(op.sizes, denv)
                y = list(torch.split(env[op.x][r], sizes, op.dim))
            elif k == "cat":
                y = [torch.cat([env[n][r] for n in op.xs], op.dim)]
            elif k == "slice":
                x = env[op.x][r]
                stop = x.shape[op.dim] if op.stop is None else _dim(op.stop, denv)
                start = _dim(op.start, denv)
                y = [x.narrow(op.dim, start, stop - start)]
            elif k == "copy":
                y = [_round(env[op.x][r], dtype)]
            elif k == "view":
                y = [env[op.x][r].reshape([_dim(d, denv) for d in op.shape])]
            elif k in ("pad", "shard"):
                x = env[op.x][r]
                d = op.dim % x.dim()
                m = _dim(op.multiple, denv) if k == "pad" else plan.groups[op.group]
                n = x.shape[d]
                full = -(-n // m) * m
                shape = list(x.shape)
                shape[d] = full - n
                x = torch.cat([x, torch.zeros(shape, dtype=x.dtype)], d)
                y = [x] if k == "pad" else [x.narrow(d, r * (full // m), full // m)]
            elif k == "extern":
                shape = [_dim(d, denv) for d in op.shape]
                y = [_extern(op.fn, [env[a][r] for a in op.args], shape, op.dtype)]
            else:
                raise NotImplementedError(f"oracle: op kind {k}")
            outs.append(y)
        for i, name in enumerate(op.out):
            env[name] = [outs[r][i] for r in range(W)]
    return {o: env[o] for o in plan.outputs}
