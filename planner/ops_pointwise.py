"""Memory-bound compute ops: RMSNorm, the fused residual-add RMSNorm, gated activations,
elementwise mul and rotary embeddings. Each reads and writes its tensors once, so the
cost model prices them as bytes / bandwidth (planner/cost.py)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from .opbase import OpBase, check_outs, out_spec, same_shape
from .shapes import fmt_dim, fmt_shape

__all__ = ["RmsNorm", "AddRmsNorm", "SiluAndMul", "GeluAndMul", "Mul", "Rope", "FLOAT_DTYPES"]

FLOAT_DTYPES = ("bf16", "fp16", "fp32")
PointwiseBackend = Literal["auto", "torch", "flashinfer"]


def _float(ctx, t, field):
    if t.dtype not in FLOAT_DTYPES:
        ctx.fail(f"needs a bf16, fp16 or fp32 input; '{t.name}' is {t.dtype}", field)


def _norm_weight(ctx, x, w):
    if w.rank != 1 or not ctx.probes.equal(w.shape[0], x.shape[-1]):
        ctx.fail(f"the norm weight '{w.name}' is {fmt_shape(w.shape)} but '{x.name}' has"
                 f" {fmt_dim(x.shape[-1])} features: it must be [{fmt_dim(x.shape[-1])}]", "w")
    if w.dtype != x.dtype:
        ctx.fail(f"dtype mismatch: '{x.name}' is {x.dtype} but the weight '{w.name}' is {w.dtype}", "w")


class RmsNorm(OpBase):
    """y = x / sqrt(mean(x^2, last dim) + eps) * w, computed in fp32, rounded once."""
    op: Literal["rmsnorm"]
    x: str
    w: str
    eps: float = Field(1e-6, gt=0, description="Added to the mean square (> 0).")
    backend: PointwiseBackend = "auto"

    def inputs(self):
        return [self.x, self.w]

    def infer(self, ctx):
        x, w = ctx.tensor(self.x, "x"), ctx.tensor(self.w, "w")
        _float(ctx, x, "x")
        _norm_weight(ctx, x, w)
        return [out_spec(self, ctx, x.shape, x.dtype)]


class AddRmsNorm(OpBase):
    """normed, residual_out = add_rmsnorm(x, residual, w): residual_out = x + residual (fp32 sum,
    stored in the input dtype) and normed = rmsnorm(the fp32 sum) * w. With `inplace: true` the
    outputs reuse the inputs' memory (normed in x, residual_out in residual), as FlashInfer's
    fused_add_rmsnorm does; the planner then requires that no other op reads x or residual."""
    op: Literal["add_rmsnorm"]
    x: str
    residual: str
    w: str
    eps: float = Field(1e-6, gt=0, description="Added to the mean square (> 0).")
    inplace: bool = Field(False, description="Write the results over x and residual.")
    backend: PointwiseBackend = "auto"
    INPLACE_FIELDS: ClassVar[tuple[str, ...]] = ("x", "residual")

    def inputs(self):
        return [self.x, self.residual, self.w]

    def n_outputs(self):
        return 2

    def infer(self, ctx):
        check_outs(self, ctx, 2)
        x, r, w = ctx.tensor(self.x, "x"), ctx.tensor(self.residual, "residual"), ctx.tensor(self.w, "w")
        _float(ctx, x, "x")
        return residual_norm_specs(self, ctx, x, r, w, ((self.x, x, "x", 0), (self.residual, r, "residual", 1)))


class _GatedAct(OpBase):
    x: str
    backend: PointwiseBackend = "auto"

    def inputs(self):
        return [self.x]

    def infer(self, ctx):
        x = ctx.tensor(self.x, "x")
        _float(ctx, x, "x")
        n = x.shape[-1]
        if not isinstance(n, int) or n % 2:
            ctx.fail(f"the last dim of '{self.x}' ({fmt_dim(n)}) must be even: [gate | up] halves", "x")
        return [out_spec(self, ctx, tuple(x.shape[:-1]) + (n // 2,), x.dtype)]


class SiluAndMul(_GatedAct):
    """x [..., 2d] -> silu(x[..., :d]) * x[..., d:] (the gate is the first half)."""
    op: Literal["silu_and_mul"]


class GeluAndMul(_GatedAct):
    """x [..., 2d] -> gelu(x[..., :d]) * x[..., d:]; approximate 'tanh' for the tanh form."""
    op: Literal["gelu_and_mul"]
    approximate: Literal["none", "tanh"] = "none"


class Mul(OpBase):
    """Elementwise a * b; b may have 1 where a has a larger dim (e.g. [T, 1] routing weights)."""
    op: Literal["mul"]
    a: str
    b: str

    def inputs(self):
        return [self.a, self.b]

    def infer(self, ctx):
        a, b = ctx.tensor(self.a, "a"), ctx.tensor(self.b, "b")
        _float(ctx, a, "a")
        if a.rank != b.rank or not all(ctx.probes.equal(x, y) or y == 1 for x, y in zip(a.shape, b.shape, strict=True)):
            ctx.fail(f"shape mismatch: '{self.b}' {fmt_shape(b.shape)} does not broadcast to '{self.a}'"
                     f" {fmt_shape(a.shape)} (same rank; each dim equal or 1)", "b")
        if a.dtype != b.dtype:
            ctx.fail(f"dtype mismatch: '{self.a}' is {a.dtype} but '{self.b}' is {b.dtype}", "b")
        return [out_spec(self, ctx, a.shape, a.dtype)]


class Rope(OpBase):
    """q_out, k_out = rope(q, k, positions, cos_sin_cache): rotary embedding of q [T, Hq, D] and
    k [T, Hk, D] (or [T, D]) at int positions [T]; cos_sin_cache [max_pos, D] fp32 holds cos in its
    first half and sin in its second. interleave=false rotates the halves (NeoX), true the even/odd
    pairs (GPT-J; DeepSeek-V3)."""
    op: Literal["rope"]
    q: str
    k: str
    positions: str
    cos_sin_cache: str
    interleave: bool = False
    backend: PointwiseBackend = "auto"

    def inputs(self):
        return [self.q, self.k, self.positions, self.cos_sin_cache]

    def n_outputs(self):
        return 2

    def infer(self, ctx):
        check_outs(self, ctx, 2)
        q, k = ctx.tensor(self.q, "q"), ctx.tensor(self.k, "k")
        pos, cache = ctx.tensor(self.positions, "positions"), ctx.tensor(self.cos_sin_cache, "cos_sin_cache")
        for t, f in ((q, "q"), (k, "k")):
            _float(ctx, t, f)
            if t.rank not in (2, 3):
                ctx.fail(f"'{t.name}' must be [tokens, heads, dim] or [tokens, dim], got {fmt_shape(t.shape)}", f)
        if k.dtype != q.dtype:
            ctx.fail(f"dtype mismatch: '{self.q}' is {q.dtype} but '{self.k}' is {k.dtype}", "k")
        d = q.shape[-1]
        if not ctx.probes.equal(k.shape[-1], d):
            ctx.fail(f"head dims differ: '{self.q}' has {fmt_dim(d)}, '{self.k}' has {fmt_dim(k.shape[-1])}", "k")
        if not isinstance(d, int) or d % 2:
            ctx.fail(f"the rotary dim {fmt_dim(d)} must be an even constant", "q")
        if pos.rank != 1 or pos.dtype not in ("int32", "int64"):
            ctx.fail(f"positions '{self.positions}' must be int32/int64 [tokens], got {pos.dtype}{fmt_shape(pos.shape)}",
                     "positions")
        for t, f in ((k, "k"), (pos, "positions")):
            if not ctx.probes.equal(t.shape[0], q.shape[0]):
                ctx.fail(f"token counts differ: '{self.q}' has {fmt_dim(q.shape[0])}, '{t.name}' has"
                         f" {fmt_dim(t.shape[0])}", f)
        if cache.rank != 2 or not ctx.probes.equal(cache.shape[1], d) or cache.dtype != "fp32":
            ctx.fail(f"cos_sin_cache '{self.cos_sin_cache}' must be fp32 [max_pos, {d}] (cos | sin halves),"
                     f" got {cache.dtype}{fmt_shape(cache.shape)}", "cos_sin_cache")
        if cache.shape[0] == 0:
            ctx.fail(f"cos_sin_cache '{self.cos_sin_cache}' has no rows: positions index its rows", "cos_sin_cache")
        return [out_spec(self, ctx, q.shape, q.dtype, 0), out_spec(self, ctx, k.shape, k.dtype, 1)]


def residual_norm_specs(op, ctx, x, r, w, overwritten) -> list:
    """The (normed, new residual) specs of a residual-add + RMSNorm over x, residual r and weight w;
    with op.inplace, each (name, spec, field, output index) of `overwritten` is written over."""
    if not same_shape(ctx, x, r):
        ctx.fail(f"shape mismatch: '{op.x}' is {fmt_shape(x.shape)} but '{op.residual}' is"
                 f" {fmt_shape(r.shape)}", "residual")
    if r.dtype != x.dtype:
        ctx.fail(f"dtype mismatch: '{op.x}' is {x.dtype} but '{op.residual}' is {r.dtype}", "residual")
    _norm_weight(ctx, x, w)
    alias: list[dict] = [{}, {}]
    if op.inplace:
        for name, t, f, i in overwritten:
            if t.producer is None:
                ctx.fail(f"inplace: '{name}' is a plan {t.kind}; only values the plan makes can be"
                         " overwritten", f)
            if t.alias_of is not None and not t.meta.get("inplace"):
                ctx.fail(f"inplace: '{name}' is a view of '{t.alias_of}'; writing it would change that"
                         " tensor too", f)
            if not t.contiguous:
                ctx.fail(f"inplace: '{name}' is not contiguous (a strided view, or a region output that"
                         " one variant makes as one); the fused kernel writes contiguous rows", f)
            # the result lives in the input's memory: a new value there, not a view of it
            alias[i] = {"alias_of": name, "meta": {"inplace": True}}
    return [out_spec(op, ctx, x.shape, x.dtype, 0, **alias[0]), out_spec(op, ctx, x.shape, x.dtype, 1, **alias[1])]
