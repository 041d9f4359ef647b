"""Op kinds: one pydantic model per op, in a discriminated union on `op`.

The validated model is the graph node's payload. Each model knows its input
tensor names and infers its outputs' shapes and dtypes symbolically through an
InferCtx (see loader.py), which turns failures into located PlanErrors.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from .expr import Bin, Call, Num
from .shapes import DTYPES, TensorSpec, fmt_dim, fmt_shape

__all__ = ["OpBase", "Op", "OP_KINDS", "COLLECTIVES", "VIEW_OPS"]

DimExpr = int | str
Backend = Literal["auto", "torch", "cute", "flashinfer"]


def _lift(d):
    return Num(d) if isinstance(d, int) else d


class OpBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)

    id: str = Field("", description="Unique op id; defaults to the first output's name.")
    out: list[str] = Field(default_factory=list, description="Output tensor names ('_' discards).")
    stream: str | None = Field(None, description="Pin the op to a stream; otherwise the planner decides.")
    doc: str | None = Field(None, description="Free text shown in reports and pictures.")

    def inputs(self) -> list[str]:
        return []

    def n_outputs(self) -> int:
        return 1

    def infer(self, ctx) -> list[TensorSpec]:  # pragma: no cover - every kind overrides
        raise NotImplementedError

    def attrs(self) -> dict:
        """Op-specific fields (for reports, hashing and pictures)."""
        skip = {"id", "out", "stream", "doc", "op"}
        return {k: v for k, v in self.model_dump().items() if k not in skip and v not in (None, [], "")}

    @property
    def kind(self) -> str:
        return self.op  # type: ignore[attr-defined]


def _norm_dim(ctx, spec: TensorSpec, dim: int, field: str = "dim") -> int:
    r = spec.rank
    if not -r <= dim < r:
        ctx.fail(f"dim {dim} does not exist: '{spec.name}' has rank {r} {fmt_shape(spec.shape)}", field)
    return dim % r


def _out(self, ctx, shape, dtype, **kw) -> TensorSpec:
    return TensorSpec(self.out[0] if self.out else self.id, tuple(shape), dtype, **kw)


# ---------------------------------------------------------------- collectives

class AllGather(OpBase):
    """Gather `x` from every rank of `group` along `dim` (rank-major)."""
    op: Literal["all_gather"]
    x: str
    group: str
    dim: int = 0
    fused_from: list[str] = Field(default_factory=list, description="Set by fuse-collectives.")

    def inputs(self):
        return [self.x]

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        size = ctx.group(self.group, "group")
        d = _norm_dim(ctx, t, self.dim)
        shape = list(t.shape)
        shape[d] = ctx.simplify(Bin("*", _lift(shape[d]), Num(size))) if not isinstance(shape[d], int) else shape[d] * size
        return [_out(self, ctx, shape, t.dtype)]


class ReduceScatter(OpBase):
    """Sum `x` over `group` and keep this rank's 1/size chunk along `dim`."""
    op: Literal["reduce_scatter"]
    x: str
    group: str
    dim: int = 0
    reduce: Literal["sum", "max", "min"] = "sum"
    fused_from: list[str] = Field(default_factory=list)

    def inputs(self):
        return [self.x]

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        size = ctx.group(self.group, "group")
        d = _norm_dim(ctx, t, self.dim)
        n = t.shape[d]
        if not ctx.probes.holds(lambda b: ctx.at(n, b) % size == 0):
            ctx.fail(f"dim {d} of '{self.x}' ({fmt_dim(n)}) is not always a multiple of the group size {size};"
                     " pad it first (pad or shard)", "x")
        shape = list(t.shape)
        shape[d] = n // size if isinstance(n, int) else ctx.simplify(Bin("/", n, Num(size)))
        return [_out(self, ctx, shape, t.dtype)]


class AllReduce(OpBase):
    """Sum `x` over `group`; every rank gets the full result."""
    op: Literal["all_reduce"]
    x: str
    group: str
    reduce: Literal["sum", "max", "min"] = "sum"
    fused_from: list[str] = Field(default_factory=list)

    def inputs(self):
        return [self.x]

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        ctx.group(self.group, "group")
        return [_out(self, ctx, t.shape, t.dtype)]


# ---------------------------------------------------------------- compute

class Gemm(OpBase):
    """out[M, N] = a[M, K] @ b[N, K]^T (b is a weight in nn.Linear layout)."""
    op: Literal["gemm"]
    a: str
    b: str
    out_dtype: str | None = None
    backend: Backend = "auto"

    def inputs(self):
        return [self.a, self.b]

    def infer(self, ctx):
        a, b = ctx.tensor(self.a, "a"), ctx.tensor(self.b, "b")
        if a.rank != 2 or b.rank != 2:
            ctx.fail(f"gemm needs 2-D operands; got '{self.a}' {fmt_shape(a.shape)} and '{self.b}' {fmt_shape(b.shape)}", "a")
        if not ctx.probes.equal(a.shape[1], b.shape[1]):
            ctx.fail(f"K mismatch: '{self.a}' has K={fmt_dim(a.shape[1])} but '{self.b}' has K={fmt_dim(b.shape[1])}"
                     " (b is [N, K])", "b")
        if a.dtype != b.dtype:
            ctx.fail(f"dtype mismatch: '{self.a}' is {a.dtype} but '{self.b}' is {b.dtype}", "b")
        dt = ctx.dtype(self.out_dtype, "out_dtype") if self.out_dtype else a.dtype
        return [_out(self, ctx, (a.shape[0], b.shape[0]), dt)]


class Add(OpBase):
    """Elementwise a + b (same shape and dtype)."""
    op: Literal["add"]
    a: str
    b: str

    def inputs(self):
        return [self.a, self.b]

    def infer(self, ctx):
        a, b = ctx.tensor(self.a, "a"), ctx.tensor(self.b, "b")
        if a.rank != b.rank or not all(ctx.probes.equal(x, y) for x, y in zip(a.shape, b.shape, strict=True)):
            ctx.fail(f"shape mismatch: '{self.a}' is {fmt_shape(a.shape)} but '{self.b}' is {fmt_shape(b.shape)}", "b")
        if a.dtype != b.dtype:
            ctx.fail(f"dtype mismatch: '{self.a}' is {a.dtype} but '{self.b}' is {b.dtype}", "b")
        return [_out(self, ctx, a.shape, a.dtype)]


class Extern(OpBase):
    """Opaque user code (the rest of a layer); bound to a callable at build time."""
    op: Literal["extern"]
    fn: str
    args: list[str] = Field(default_factory=list)
    shape: list[DimExpr]
    dtype: str = "bf16"
    cost_us: float | None = Field(None, description="Time estimate for the cost model.")

    def inputs(self):
        return list(self.args)

    def infer(self, ctx):
        for i, a in enumerate(self.args):
            ctx.tensor(a, ("args", i))
        shape = [ctx.dim(d, ("shape", i)) for i, d in enumerate(self.shape)]
        return [_out(self, ctx, shape, ctx.dtype(self.dtype, "dtype"))]


# ---------------------------------------------------------------- data movement

class Split(OpBase):
    """Split `x` along `dim` into pieces of `sizes` (views)."""
    op: Literal["split"]
    x: str
    sizes: list[DimExpr] | DimExpr
    dim: int = -1

    def inputs(self):
        return [self.x]

    def n_outputs(self):
        return len(self.out)

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        d = _norm_dim(ctx, t, self.dim)
        total = t.shape[d]
        if isinstance(self.sizes, list):
            sizes = [ctx.dim(s, ("sizes", i)) for i, s in enumerate(self.sizes)]
        else:
            chunk = ctx.dim(self.sizes, "sizes")
            if not isinstance(chunk, int) or not isinstance(total, int) or chunk <= 0 or total % chunk:
                ctx.fail(f"split size {fmt_dim(chunk)} does not divide dim {d} of '{self.x}' ({fmt_dim(total)})", "sizes")
            sizes = [chunk] * (total // chunk)
        if len(sizes) != len(self.out):
            ctx.fail(f"split makes {len(sizes)} pieces but {len(self.out)} output names are given", "out")
        sum_expr = sizes[0]
        for s in sizes[1:]:
            sum_expr = ctx.simplify(Bin("+", _lift(sum_expr), _lift(s)))
        if not ctx.probes.equal(sum_expr, total):
            ctx.fail(f"split sizes sum to {fmt_dim(sum_expr)} but '{self.x}' has {fmt_dim(total)} on dim {self.dim}", "sizes")
        outs = []
        for name, s in zip(self.out, sizes, strict=True):
            shape = list(t.shape)
            shape[d] = s
            contiguous = t.contiguous and (d == 0 or all(x == 1 for x in t.shape[:d]))
            outs.append(TensorSpec(name, tuple(shape), t.dtype, contiguous=contiguous, alias_of=t.alias_of or t.name))
        return outs


class Cat(OpBase):
    """Concatenate `xs` along `dim`. `inplace` lists members whose producers write straight into their slot."""
    op: Literal["cat"]
    xs: list[str]
    dim: int = -1
    inplace: list[str] = Field(default_factory=list, description="Set by fuse-collectives (zero-copy packing).")

    def inputs(self):
        return list(self.xs)

    def infer(self, ctx):
        if not self.xs:
            ctx.fail("cat needs at least one input", "xs")
        specs = [ctx.tensor(x, ("xs", i)) for i, x in enumerate(self.xs)]
        first = specs[0]
        d = _norm_dim(ctx, first, self.dim)
        total = first.shape[d]
        for i, s in enumerate(specs[1:], 1):
            if s.rank != first.rank:
                ctx.fail(f"'{s.name}' has rank {s.rank} but '{first.name}' has rank {first.rank}", ("xs", i))
            if s.dtype != first.dtype:
                ctx.fail(f"dtype mismatch: '{s.name}' is {s.dtype} but '{first.name}' is {first.dtype}", ("xs", i))
            for j, (a, b) in enumerate(zip(first.shape, s.shape, strict=True)):
                if j != d and not ctx.probes.equal(a, b):
                    ctx.fail(f"cannot cat on dim {self.dim}: dim {j} differs ('{first.name}' {fmt_shape(first.shape)},"
                             f" '{s.name}' {fmt_shape(s.shape)})", ("xs", i))
            total = ctx.simplify(Bin("+", _lift(total), _lift(s.shape[d]))) if not (
                isinstance(total, int) and isinstance(s.shape[d], int)) else total + s.shape[d]
        shape = list(first.shape)
        shape[d] = total
        return [_out(self, ctx, shape, first.dtype)]


class Slice(OpBase):
    """x[start:stop] along `dim` (a view)."""
    op: Literal["slice"]
    x: str
    dim: int = 0
    start: DimExpr = 0
    stop: DimExpr | None = None

    def inputs(self):
        return [self.x]

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        d = _norm_dim(ctx, t, self.dim)
        n = t.shape[d]
        start = ctx.dim(self.start, "start")
        stop = n if self.stop is None else ctx.dim(self.stop, "stop")
        ok = ctx.probes.holds(lambda b: 0 <= ctx.at(start, b) <= ctx.at(stop, b) <= ctx.at(n, b))
        if not ok:
            ctx.fail(f"slice [{fmt_dim(start)}:{fmt_dim(stop)}] is out of bounds for dim {d} of '{self.x}'"
                     f" ({fmt_dim(n)})", "stop" if self.stop is not None else "start")
        length = ctx.simplify(Bin("-", _lift(stop), _lift(start)))
        shape = list(t.shape)
        shape[d] = length
        contiguous = t.contiguous and (d == 0 or all(x == 1 for x in t.shape[:d]))
        return [TensorSpec(self.out[0], tuple(shape), t.dtype, contiguous=contiguous, alias_of=t.alias_of or t.name)]


class Pad(OpBase):
    """Zero-pad `dim` up to a multiple of `multiple`."""
    op: Literal["pad"]
    x: str
    dim: int = 0
    multiple: DimExpr

    def inputs(self):
        return [self.x]

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        d = _norm_dim(ctx, t, self.dim)
        m = ctx.dim(self.multiple, "multiple")
        if not isinstance(m, int) or m <= 0:
            ctx.fail(f"pad multiple must be a positive constant, got {fmt_dim(m)}", "multiple")
        shape = list(t.shape)
        shape[d] = ctx.simplify(Call("round_up", (_lift(t.shape[d]), Num(m))))
        return [_out(self, ctx, shape, t.dtype)]


class Shard(OpBase):
    """Sequence-parallel shard: pad `dim` to a multiple of the group size, keep this rank's chunk."""
    op: Literal["shard"]
    x: str
    group: str
    dim: int = 0

    def inputs(self):
        return [self.x]

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        size = ctx.group(self.group, "group")
        d = _norm_dim(ctx, t, self.dim)
        shape = list(t.shape)
        shape[d] = ctx.simplify(Call("ceil_div", (_lift(t.shape[d]), Num(size))))
        return [_out(self, ctx, shape, t.dtype)]


class Copy(OpBase):
    """Materialize `x` as a new contiguous tensor (optionally cast)."""
    op: Literal["copy"]
    x: str
    dtype: str | None = None

    def inputs(self):
        return [self.x]

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        return [_out(self, ctx, t.shape, ctx.dtype(self.dtype, "dtype") if self.dtype else t.dtype)]


class View(OpBase):
    """Reinterpret a contiguous `x` with a new shape of the same element count."""
    op: Literal["view"]
    x: str
    shape: list[DimExpr]

    def inputs(self):
        return [self.x]

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        shape = [ctx.dim(d, ("shape", i)) for i, d in enumerate(self.shape)]
        if not t.contiguous:
            ctx.fail(f"view needs a contiguous input; '{self.x}' is a strided view (copy it first)", "x")

        def numel(s, b):
            n = 1
            for d in s:
                n *= ctx.at(d, b)
            return n
        if not ctx.probes.holds(lambda b: numel(shape, b) == numel(t.shape, b)):
            ctx.fail(f"view {fmt_shape(shape)} has a different element count than '{self.x}' {fmt_shape(t.shape)}", "shape")
        return [TensorSpec(self.out[0], tuple(shape), t.dtype, alias_of=t.alias_of or t.name)]


class Select(OpBase):
    """Region output: the value produced by whichever variant ran (made by the loader)."""
    op: Literal["select"]
    region: str
    choices: list[str] = Field(description="One input per variant, in variant order.")
    variants: list[str] = Field(default_factory=list)

    def inputs(self):
        return list(self.choices)

    def infer(self, ctx):
        specs = [ctx.tensor(c, ("choices", i)) for i, c in enumerate(self.choices)]
        first = specs[0]
        for v, s in zip(self.variants[1:], specs[1:], strict=False):
            same = s.rank == first.rank and all(ctx.probes.equal(a, b) for a, b in zip(s.shape, first.shape, strict=True))
            if not same or s.dtype != first.dtype:
                ctx.fail(f"variant '{v}' gives '{self.out[0]}' as {fmt_shape(s.shape)} {s.dtype} but variant"
                         f" '{self.variants[0]}' gives {fmt_shape(first.shape)} {first.dtype}", "choices", code="variant")
        return [TensorSpec(self.out[0], first.shape, first.dtype, contiguous=all(s.contiguous for s in specs))]


Op = Annotated[
    AllGather | ReduceScatter | AllReduce | Gemm | Add | Extern | Split | Cat | Slice | Pad | Shard | Copy | View | Select,
    Field(discriminator="op"),
]
OP_MODELS = {m.model_fields["op"].annotation.__args__[0]: m for m in
             (AllGather, ReduceScatter, AllReduce, Gemm, Add, Extern, Split, Cat, Slice, Pad, Shard, Copy, View, Select)}
OP_KINDS = sorted(OP_MODELS)
USER_OPS = [k for k in OP_KINDS if k != "select"]
COLLECTIVES = {"all_gather", "reduce_scatter", "all_reduce"}
VIEW_OPS = {"split", "slice", "view", "select"}
ELEMENT_BYTES = DTYPES
