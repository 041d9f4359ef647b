"""fp8: the scale layouts a scaled gemm takes, and the activation quantize op.

Scale layouts (fp32), for a = activations [M, K] and b = a weight [N, K]:
  tensor   [1] (or [])                 one scale for the whole operand
  row      a: [M, 1]                   per token (per row of a)
  col      b: [N, 1]                   per output channel (per row of b)
  block    a: [M, ceil_div(K, 128)]    1x128 groups along K (DeepSeek-V3 activations)
           b: [ceil_div(N, 128), ceil_div(K, 128)]   128x128 blocks (DeepSeek-V3 weights)
The dequantized value of an element is q * scale of its row / block. Block scales pair
with block scales; tensor and row/col scales pair with each other.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .expr import Call, Num
from .opbase import OpBase, check_outs, lift, out_spec
from .shapes import FP8_DTYPES, SCALE_BLOCK, fmt_dim, fmt_shape

__all__ = ["BLOCK", "FP8_MAX", "scale_kind", "pair_kinds", "expected_scales", "check_scales", "Quantize"]

BLOCK = SCALE_BLOCK
FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}


def _cdiv(ctx, d, k: int):
    if isinstance(d, int):
        return -(-d // k)
    return ctx.simplify(Call("ceil_div", (lift(d), Num(k))))


def scale_kind(role: str, operand_shape, scale_shape, eq=None, prefer_block: bool = False) -> str | None:
    """'tensor' | 'row' | 'col' | 'block' for a scale of `scale_shape` on an operand [rows, K]
    (role 'a' or 'b'), or None when it fits none. `eq` compares dims (default ==)."""
    eq = eq or (lambda x, y: x == y)
    cdiv = lambda d: -(-d // BLOCK) if isinstance(d, int) else Call("ceil_div", (lift(d), Num(BLOCK)))  # noqa: E731
    rows, k = operand_shape
    s = tuple(scale_shape)
    if len(s) == 0 or (len(s) == 1 and eq(s[0], 1)):
        return "tensor"
    if len(s) != 2:
        return None
    if role == "a" and prefer_block and eq(s[0], rows) and eq(s[1], cdiv(k)):
        return "block"
    if eq(s[0], rows) and eq(s[1], 1):
        return "row" if role == "a" else "col"
    if role == "a" and eq(s[0], rows) and eq(s[1], cdiv(k)):
        return "block"
    if role == "b" and eq(s[0], cdiv(rows)) and eq(s[1], cdiv(k)):
        return "block"
    return None


def pair_kinds(a_shape, b_shape, sa_shape, sb_shape, eq=None) -> tuple:
    """(kind of scale_a, kind of scale_b). With K <= 128 a per-row a scale is also one 1x128 block
    per row; it is read as a block scale when b has block scales (the two are the same numbers)."""
    kb = scale_kind("b", b_shape, sb_shape, eq)
    ka = scale_kind("a", a_shape, sa_shape, eq)
    if ka == "row" and kb == "block" and scale_kind("a", a_shape, sa_shape, eq, prefer_block=True) == "block":
        ka = "block"
    return ka, kb


def expected_scales(ctx, role: str, operand) -> str:
    rows, k = operand.shape
    kb = fmt_dim(_cdiv(ctx, k, BLOCK))
    if role == "a":
        return f"[1] (per tensor), [{fmt_dim(rows)}, 1] (per row) or [{fmt_dim(rows)}, {kb}] (1x{BLOCK} blocks)"
    return (f"[1] (per tensor), [{fmt_dim(rows)}, 1] (per column) or [{fmt_dim(_cdiv(ctx, rows, BLOCK))}, {kb}]"
            f" ({BLOCK}x{BLOCK} blocks)")


def check_scales(ctx, op, a, b) -> tuple[str, str]:
    """Validate a scaled gemm's operands and scales; returns the (a, b) scale kinds."""
    for name, t, f in ((op.a, a, "a"), (op.b, b, "b")):
        if t.dtype not in FP8_DTYPES:
            ctx.fail(f"scale_a/scale_b need fp8 operands; '{name}' is {t.dtype}", f)
    if op.scale_a is None or op.scale_b is None:
        missing = "scale_a" if op.scale_a is None else "scale_b"
        ctx.fail(f"an fp8 gemm needs both scale_a and scale_b ({missing} is missing; a unit scale is fp32[1])",
                 "scale_b" if op.scale_a else "scale_a")
    specs = {}
    for role, operand, sname in (("a", a, op.scale_a), ("b", b, op.scale_b)):
        f = f"scale_{role}"
        s = specs[role] = ctx.tensor(sname, f)
        if s.dtype != "fp32":
            ctx.fail(f"{f} '{sname}' is {s.dtype}; scales are fp32", f)
        if scale_kind(role, operand.shape, s.shape, ctx.probes.equal) is None:
            ctx.fail(f"{f} '{sname}' is {fmt_shape(s.shape)}, which does not fit the blocks of '{operand.name}'"
                     f" {fmt_shape(operand.shape)}: expected {expected_scales(ctx, role, operand)}", f)
    ka, kb = pair_kinds(a.shape, b.shape, specs["a"].shape, specs["b"].shape, ctx.probes.equal)
    for role, operand, kind in (("a", a, ka), ("b", b, kb)):
        _check_group(ctx, op, role, operand, specs[role], kind)
    if (ka == "block") != (kb == "block"):
        ctx.fail(f"scale_a is {ka} but scale_b is {kb}: block scales pair with block scales"
                 " (1x128 activations with 128x128 weights)", "scale_b")
    return ka, kb


def _check_group(ctx, op, role: str, operand, s, kind: str) -> None:
    """Scales that quantize made (scale_group: the K elements one scale covers, per row) must be
    read as they were made: as 1x128 blocks only in groups of 128, or as one scale for the row's
    whole K (a per-row/column or per-tensor scale, or a single block column) only where the group
    spans K (a cut of per-token scales still does)."""
    g = s.meta.get("scale_group")
    if g is None:
        return
    f, name = f"scale_{role}", getattr(op, f"scale_{role}")
    k = operand.shape[1]
    spans_k = ctx.probes.holds(lambda b: g >= ctx.at(k, b))
    if kind == "block":
        if g == BLOCK or (spans_k and ctx.probes.equal(s.shape[-1], 1)):
            return
        read = f"1x{BLOCK} blocks" if role == "a" else f"{BLOCK}x{BLOCK} blocks"
        fix = f"quantize with block=[1, {BLOCK}] (or [1, K] for per-token scales)"
    else:
        if spans_k:
            return
        read = {"row": "one scale per row", "col": "one scale per output channel"}.get(kind, "one scale")
        read += f" over all of K = {fmt_dim(k)}"
        fix = f"pass all {fmt_dim(k)} // {g} scales of each row (1x{BLOCK} blocks need groups of {BLOCK})"
    ctx.fail(f"{f} '{name}' holds groups of {g} along K (made by quantize), but a {f} of shape"
             f" {fmt_shape(s.shape)} on '{operand.name}' {fmt_shape(operand.shape)} is read as {read}: {fix}", f)


class Quantize(OpBase):
    """(q, scales) = quantize(x, dtype, block=[1, G]): x [M, K] -> fp8 [M, K] and fp32 scales
    [M, ceil_div(K, G)]: per-token groups of G along K, scale = amax(group) / fp8 max."""
    op: Literal["quantize"]
    x: str
    dtype: str = Field("fp8_e4m3", description="fp8_e4m3 or fp8_e5m2.")
    block: list[int] = Field(default_factory=lambda: [1, BLOCK],
                             description="[1, G]: one scale per G elements of a row (G = K: per token).")
    backend: Literal["auto", "torch", "inductor", "flashinfer"] = "auto"

    def inputs(self):
        return [self.x]

    def n_outputs(self):
        return 2

    def infer(self, ctx):
        check_outs(self, ctx, 2)
        t = ctx.tensor(self.x, "x")
        dt = ctx.dtype(self.dtype, "dtype")
        if dt not in FP8_DTYPES:
            ctx.fail(f"quantize makes fp8 (fp8_e4m3 or fp8_e5m2), not {dt}", "dtype")
        if t.dtype not in ("bf16", "fp16", "fp32"):
            ctx.fail(f"quantize needs a floating-point input; '{self.x}' is {t.dtype}", "x")
        if t.rank != 2:
            ctx.fail(f"quantize needs a 2-D input [tokens, K]; '{self.x}' is {fmt_shape(t.shape)}", "x")
        if len(self.block) != 2 or self.block[0] != 1 or self.block[1] <= 0:
            ctx.fail(f"block must be [1, G] (per-token groups of G), got {self.block}", "block")
        g, k = self.block[1], t.shape[1]
        if not isinstance(k, int) or k % g:
            ctx.fail(f"group size {g} does not divide K = {fmt_dim(k)} of '{self.x}'", "block")
        if self.backend == "flashinfer":  # what FlashInfer's per-token-group kernel can ever run
            if g != 128 or dt != "fp8_e4m3" or t.dtype not in ("bf16", "fp16"):
                ctx.fail(f"backend=flashinfer quantizes bf16/fp16 to fp8_e4m3 in groups of 128 only (here {t.dtype}"
                         f" to {dt}, groups of {g}); use backend=auto or torch", "backend")
        return [out_spec(self, ctx, t.shape, dt, 0), out_spec(self, ctx, (t.shape[0], k // g), "fp32", 1,
                                                                  meta={"scale_group": g})]
