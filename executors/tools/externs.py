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

model_externs() gives torch implementations of real model code for the shipped
DeepSeek-V3 plans (plans/dsv3_*.yaml): rmsnorm, rope, silu_and_mul and a routed-expert
stand-in whose cost is that of the real layer (it reads the weights of every expert the
batch activates, min(experts, top_k * tokens) of them, as a fused MoE does).

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

__all__ = ["default_extern", "default_externs", "model_externs", "rmsnorm", "rope", "silu_and_mul",
           "routed_experts"]


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


# ---------------------------------------------------------------- model code (torch)

def rmsnorm(x, weight, eps: float = 1e-6):
    """RMSNorm over the last dim, computed in fp32 (x may be a strided view)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


def rope(k_pe, positions, cos_sin):
    """Neox-style rotary embedding of k_pe [T, D] at `positions` (cos | sin halves per row)."""
    cs = cos_sin.index_select(0, positions.long().remainder(cos_sin.shape[0])).float()  # random test positions
    half = k_pe.shape[-1] // 2
    cos, sin = cs[:, :half], cs[:, half:]
    x = k_pe.float()
    x1, x2 = x[:, :half], x[:, half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(k_pe.dtype)


def silu_and_mul(gu):
    half = gu.shape[-1] // 2
    return (torch.nn.functional.silu(gu[..., :half].float()) * gu[..., half:].float()).to(gu.dtype)


def routed_experts(x, logits, w_gate_up, w_down, top_k: int = 8):
    """A routed-expert stand-in with the real layer's weight traffic.

    A batch of T tokens activates min(E, top_k * T) experts (what a fused MoE reads for a
    decode batch of random tokens): experts 0..active-1, each token weighting them by the
    softmax of its logits over them (a smooth gate: a top-k choice would flip between bf16
    and fp32 references on near-ties). Expert e has gate/up rows [2 * inter * e, 2 * inter *
    (e + 1)) of w_gate_up and columns [inter * e, inter * (e + 1)) of w_down.
    """
    t = x.shape[0]
    n_exp = logits.shape[-1]
    inter = w_down.shape[1] // n_exp
    active = min(n_exp, top_k * t)
    gate = torch.softmax(logits[:, :active].float(), dim=-1).to(x.dtype)
    h = (x @ w_gate_up[: active * 2 * inter].t()).view(t, active, 2, inter)   # [T, active, 2, inter]
    a = torch.nn.functional.silu(h[:, :, 0]) * h[:, :, 1] * gate.unsqueeze(-1)
    return a.reshape(t, active * inter) @ w_down[:, : active * inter].t()


def model_externs() -> dict:
    """{extern fn name: torch implementation} for the plans/dsv3_*.yaml model code."""
    return {"rmsnorm": rmsnorm, "rope": rope, "silu_and_mul": silu_and_mul, "routed_experts": routed_experts}
