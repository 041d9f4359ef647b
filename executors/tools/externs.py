"""Deterministic stand-ins for extern ops (model code the plan does not describe).

For `planner run` and the tests, an extern `fn(*args) -> [shape] dtype` that the
caller did not bind is replaced by a fixed, seeded function of its inputs:

  mix[j] = sum_i c_i * flat(args[i])[j mod numel(args[i])]        (fp32)
  out    = rmsnorm_lastdim(mix.view(shape)).to(dtype)

with coefficients c_i drawn from a generator seeded by crc32(fn name), so the same
extern gives the same result on every rank, in every process and in the reference
run. The RMS normalisation keeps 90 chained "layers" in range, like the norms of the
real model. It is a stand-in, not model code: it exists so that runs on random
inputs are reproducible and checkable; real deployments pass externs=.

Stand-ins are marked `wants_shape`: the executor calls them with the declared
output shape and dtype of the site (fn(*args, out_shape=..., dtype=...)), so one
name can serve sites of different shapes. A site with several results
(`a, b: extern(fn, x, shapes=[...], dtypes=[...])`) calls fn(*args, out_shapes=[...],
dtypes=[...]) and gets one tensor per result: result i mixes the inputs with the
coefficients rotated by i, so the results differ from each other.
"""

from __future__ import annotations

import zlib

import torch

__all__ = ["default_extern", "default_externs"]


def default_extern(name: str):
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    coeffs = ((torch.rand(64, generator=gen) + 0.5) * torch.where(torch.rand(64, generator=gen) > 0.5, 1.0, -1.0)).tolist()

    def one(args, out_shape, dtype, salt=0):
        n = 1
        for d in out_shape:
            n *= d
        dev = args[0].device if args else "cpu"
        mix = torch.zeros(n, dtype=torch.float32, device=dev)
        idx = None
        for i, a in enumerate(args):
            flat = a.reshape(-1).float()
            if flat.numel() == 0:
                continue
            if flat.numel() != n:
                if idx is None:
                    idx = torch.arange(n, device=dev)
                flat = flat[idx % flat.numel()]
            mix += coeffs[(i + salt) % 64] * flat
        y = mix.view(tuple(out_shape))
        if not dtype.is_floating_point:  # e.g. expert ids or counts: small non-negative ints
            return (y.abs() * 4).floor().remainder(8).to(dtype)
        if y.dim() >= 1 and y.shape[-1] > 0:
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
        return y.to(dtype)

    def fn(*args, out_shape=None, dtype=None, out_shapes=None, dtypes=None):
        if out_shapes is not None:
            return [one(args, s, d, salt=j * 7) for j, (s, d) in enumerate(zip(out_shapes, dtypes, strict=True))]
        return one(args, out_shape, dtype)
    fn.wants_shape = True
    fn.__name__ = f"standin_{name}"
    fn.__doc__ = f"deterministic stand-in for extern '{name}' (executors.tools.externs)"
    return fn


def default_externs(plan, only_missing: dict | None = None) -> dict:
    """{fn name: stand-in} for every extern fn the plan calls (except those in only_missing)."""
    have = only_missing or {}
    return {op.fn: default_extern(op.fn) for op in plan.ops if op.op == "extern" and op.fn not in have}
