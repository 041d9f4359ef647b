"""Op kinds: one pydantic model per op, in a discriminated union on `op`.

The validated model is the graph node's payload. Each model knows its input
tensor names and infers its outputs' shapes and dtypes symbolically through an
InferCtx (see loader.py), which turns failures into located PlanErrors.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from .expr import Bin, Call, Num, unparse
from .opbase import Backend, DimExpr, OpBase, carried_meta, check_outs, mul_dim
from .opbase import lift as _lift
from .opbase import norm_dim as _norm_dim
from .opbase import out_spec as _out
from .ops_fp8 import Quantize, check_scales
from .ops_pointwise import (
    FLOAT_DTYPES,
    AddRmsNorm,
    GeluAndMul,
    Mul,
    RmsNorm,
    Rope,
    SiluAndMul,
    residual_norm_specs,
)
from .shapes import DTYPES, FP8_DTYPES, TensorSpec, fmt_dim, fmt_shape

__all__ = ["OpBase", "Op", "OP_KINDS", "COLLECTIVES", "PACKABLE_COLLECTIVES", "VIEW_OPS", "ARITH_OPS"]

Reduce = Literal["sum", "avg", "max", "min"]


def _check_reduce(ctx, op, t):
    if t.dtype in FP8_DTYPES:  # no reduction adds fp8 values (and a per-rank scale would not commute)
        ctx.fail(f"{op.op} cannot reduce fp8 ('{t.name}' is {t.dtype}): reduce the dequantized bf16/fp32"
                 " values, or gather the fp8 values and their scales", "x")
    if op.reduce == "avg" and t.dtype not in ("bf16", "fp16", "fp32"):
        ctx.fail(f"reduce=avg needs a floating-point tensor; '{t.name}' is {t.dtype}", "reduce")


# ---------------------------------------------------------------- collectives

class AllGather(OpBase):
    """Gather `x` from every rank of `group` along `dim` (rank-major)."""
    op: Literal["all_gather"]
    x: str
    group: str
    dim: int = 0
    backend: Literal["auto", "torch", "p2p"] = Field(
        "auto", description="torch: torch.distributed (NCCL/gloo); p2p: symmetric-memory pushes within one host.")
    fused_from: list[str] = Field(default_factory=list, description="Set by fuse-collectives.")

    def inputs(self):
        return [self.x]

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        size = ctx.group(self.group, "group")
        d = _norm_dim(ctx, t, self.dim)
        if self.backend == "p2p":  # what the symmetric-memory gather can ever run (rows pushed whole)
            if d != 0:
                ctx.fail(f"backend=p2p gathers along dim 0 only (here dim {self.dim}); use backend=auto or torch",
                         "backend")
            if any(not isinstance(n, int) for n in t.shape[1:]):
                ctx.fail(f"backend=p2p needs a static row size; '{self.x}' is {fmt_shape(t.shape)}", "backend")
        shape = list(t.shape)
        shape[d] = ctx.simplify(Bin("*", _lift(shape[d]), Num(size))) if not isinstance(shape[d], int) else shape[d] * size
        return [_out(self, ctx, shape, t.dtype, meta=carried_meta(t))]


class ReduceScatter(OpBase):
    """Sum `x` over `group` and keep this rank's 1/size chunk along `dim`."""
    op: Literal["reduce_scatter"]
    x: str
    group: str
    dim: int = 0
    reduce: Reduce = "sum"
    fused_from: list[str] = Field(default_factory=list)

    def inputs(self):
        return [self.x]

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        size = ctx.group(self.group, "group")
        _check_reduce(ctx, self, t)
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
    reduce: Reduce = Field("sum", description="avg: NCCL's native average; sum / size on gloo.")
    fused_from: list[str] = Field(default_factory=list)

    def inputs(self):
        return [self.x]

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        ctx.group(self.group, "group")
        _check_reduce(ctx, self, t)
        return [_out(self, ctx, t.shape, t.dtype)]


class AllToAll(OpBase):
    """Expert-parallel exchange: `x` [size * splits, ...] holds one chunk of `splits` rows per rank of
    `group`; chunk j goes to rank j and the result holds the chunk from every rank (rank-major).
    `splits` is the per-peer capacity (a dim expression: static, or the worst case over dims, e.g.
    num_tokens * topk). With `counts` (int [size]: rows actually used in each outgoing chunk) the
    op also returns the counts each peer sent here. Never fused with other collectives."""
    op: Literal["all_to_all"]
    x: str
    group: str
    splits: DimExpr
    counts: str | None = None

    def inputs(self):
        return [self.x] + ([self.counts] if self.counts else [])

    def n_outputs(self):
        return 2 if self.counts else 1

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        size = ctx.group(self.group, "group")
        cap = ctx.dim(self.splits, "splits")
        if t.rank < 1 or not ctx.probes.equal(t.shape[0], mul_dim(ctx, cap, size)) and not (
                size == 1 and ctx.probes.equal(t.shape[0], cap)):
            ctx.fail(f"dim 0 of '{self.x}' is {fmt_dim(t.shape[0]) if t.rank else '-'} but {size} chunks of splits ="
                     f" {fmt_dim(cap)} rows make {fmt_dim(mul_dim(ctx, cap, size))}", "splits")
        outs = [_out(self, ctx, t.shape, t.dtype, meta=carried_meta(t))]
        if self.counts:
            check_outs(self, ctx, 2)
            c = ctx.tensor(self.counts, "counts")
            if c.rank != 1 or not ctx.probes.equal(c.shape[0], size) or c.dtype not in ("int32", "int64"):
                ctx.fail(f"counts '{self.counts}' must be int32/int64 [{size}] (rows per peer), got"
                         f" {c.dtype}{fmt_shape(c.shape)}", "counts")
            outs.append(_out(self, ctx, c.shape, c.dtype, 1))
        return outs


class AllReduceAddRmsNorm(OpBase):
    """normed, residual_out = all_reduce_add_rmsnorm(x, residual, w, group): all_reduce(x, group)
    (sum) then add_rmsnorm(., residual, w, eps), as one op. Made by the fuse-allreduce-norm pass
    (which lists the two ops it replaced in `fused_from`); lowered to FlashInfer's fused
    all-reduce + residual + RMSNorm kernel where capability and the tuned size limits allow, to
    the all_reduce and a separate add_rmsnorm otherwise. With `inplace: true` residual_out
    overwrites residual (normed is always a new tensor: the reduced sum is never materialized)."""
    op: Literal["all_reduce_add_rmsnorm"]
    x: str
    residual: str
    w: str
    group: str
    eps: float = Field(1e-6, gt=0, description="Added to the mean square (> 0).")
    inplace: bool = Field(False, description="Write residual_out over residual.")
    backend: Literal["auto", "torch", "flashinfer"] = Field(
        "auto", description="torch: the collective then the torch norm; flashinfer: the fused kernel where it fits.")
    fused_from: list[str] = Field(default_factory=list, description="Set by fuse-allreduce-norm.")
    INPLACE_FIELDS: ClassVar[tuple[str, ...]] = ("residual",)  # x is reduced into a new buffer

    def inputs(self):
        return [self.x, self.residual, self.w]

    def n_outputs(self):
        return 2

    def infer(self, ctx):
        check_outs(self, ctx, 2)
        x, r, w = ctx.tensor(self.x, "x"), ctx.tensor(self.residual, "residual"), ctx.tensor(self.w, "w")
        ctx.group(self.group, "group")
        if x.dtype not in FLOAT_DTYPES:
            ctx.fail(f"needs a bf16, fp16 or fp32 input; '{x.name}' is {x.dtype}", "x")
        return residual_norm_specs(self, ctx, x, r, w, ((self.residual, r, "residual", 1),))


# ---------------------------------------------------------------- compute

class Gemm(OpBase):
    """out[M, N] = a[M, K] @ b[N, K]^T (b is a weight in nn.Linear layout). fp8 operands take
    fp32 scales (planner/ops_fp8.py: per tensor, per row/column, or DeepSeek-V3 blocks) and give
    out_dtype (bf16 by default): out = (a * scale_a) @ (b * scale_b)^T."""
    op: Literal["gemm"]
    a: str
    b: str
    out_dtype: str | None = None
    scale_a: str | None = Field(None, description="fp32 scales of a (fp8 only).")
    scale_b: str | None = Field(None, description="fp32 scales of b (fp8 only).")
    backend: Backend = "auto"

    def inputs(self):
        return [self.a, self.b] + [s for s in (self.scale_a, self.scale_b) if s]

    @property
    def scaled(self) -> bool:
        return self.scale_a is not None or self.scale_b is not None

    def infer(self, ctx):
        a, b = ctx.tensor(self.a, "a"), ctx.tensor(self.b, "b")
        if a.rank != 2 or b.rank != 2:
            ctx.fail(f"gemm needs 2-D operands; got '{self.a}' {fmt_shape(a.shape)} and '{self.b}' {fmt_shape(b.shape)}", "a")
        if not ctx.probes.equal(a.shape[1], b.shape[1]):
            ctx.fail(f"K mismatch: '{self.a}' has K={fmt_dim(a.shape[1])} but '{self.b}' has K={fmt_dim(b.shape[1])}"
                     " (b is [N, K])", "b")
        fp8 = [t.dtype in FP8_DTYPES for t in (a, b)]
        if not self.scaled and fp8[0] != fp8[1]:
            q, other = (a, b) if fp8[0] else (b, a)
            ctx.fail(f"dtype mismatch: '{q.name}' is {q.dtype} but '{other.name}' is {other.dtype}: an fp8 gemm takes"
                     f" two fp8 operands with scale_a and scale_b (quantize '{other.name}', or dequantize"
                     f" '{q.name}')", "b" if fp8[0] else "a")
        if self.scaled or any(fp8):
            check_scales(ctx, self, a, b)
            dt = ctx.dtype(self.out_dtype, "out_dtype") if self.out_dtype else "bf16"
            if dt not in ("bf16", "fp16", "fp32"):
                ctx.fail(f"an fp8 gemm gives bf16, fp16 or fp32, not {dt}", "out_dtype")
            return [_out(self, ctx, (a.shape[0], b.shape[0]), dt)]
        if a.dtype != b.dtype:
            ctx.fail(f"dtype mismatch: '{self.a}' is {a.dtype} but '{self.b}' is {b.dtype}", "b")
        dt = ctx.dtype(self.out_dtype, "out_dtype") if self.out_dtype else a.dtype
        if self.out_dtype and a.dtype in FLOAT_DTYPES and dt not in FLOAT_DTYPES:
            # an unscaled cast: fp8 saturates (512 -> 448), integers truncate
            hint = " (quantize its result for fp8)" if dt in FP8_DTYPES else ""
            ctx.fail(f"a {a.dtype} gemm gives bf16, fp16 or fp32, not {dt}{hint}", "out_dtype")
        return [_out(self, ctx, (a.shape[0], b.shape[0]), dt)]


class GemmChain(OpBase):
    """Two dependent GEMMs as one op (made by fuse-gemm-chains): out = a @ b^T, then
    out2 = out[:, col:col + width] @ b2^T. Outputs [out, out2]; backends run both in one kernel
    where they can, torch runs the two GEMMs."""
    op: Literal["gemm_chain"]
    a: str
    b: str
    b2: str = Field(description="Weight of the second GEMM, [N2, width].")
    col: int = Field(description="First column of out that the second GEMM reads.")
    width: int = Field(description="Columns of out the second GEMM reads (its K).")
    backend: Backend = "auto"
    fused_from: list[str] = Field(default_factory=list, description="Set by fuse-gemm-chains: the two gemm ids.")

    def inputs(self):
        return [self.a, self.b, self.b2]

    def n_outputs(self):
        return 2

    def infer(self, ctx):
        a, b, b2 = ctx.tensor(self.a, "a"), ctx.tensor(self.b, "b"), ctx.tensor(self.b2, "b2")
        for spec, field in ((a, "a"), (b, "b"), (b2, "b2")):
            if spec.rank != 2:
                ctx.fail(f"gemm_chain needs 2-D operands; '{spec.name}' is {fmt_shape(spec.shape)}", field)
        if not ctx.probes.equal(a.shape[1], b.shape[1]):
            ctx.fail(f"K mismatch: '{self.a}' has K={fmt_dim(a.shape[1])} but '{self.b}' has K={fmt_dim(b.shape[1])}"
                     " (b is [N, K])", "b")
        n = b.shape[0]
        if self.col < 0 or self.width < 1 or not ctx.probes.holds(lambda x: self.col + self.width <= ctx.at(n, x)):
            ctx.fail(f"columns [{self.col}, {self.col + self.width}) are not inside the first GEMM's N={fmt_dim(n)}",
                     "width")
        if not ctx.probes.equal(b2.shape[1], self.width):
            ctx.fail(f"'{self.b2}' has K={fmt_dim(b2.shape[1])} but the second GEMM reads {self.width} columns", "b2")
        for spec, field in ((b, "b"), (b2, "b2")):
            if spec.dtype != a.dtype:
                ctx.fail(f"dtype mismatch: '{self.a}' is {a.dtype} but '{spec.name}' is {spec.dtype}", field)
        if len(self.out) != 2:
            ctx.fail(f"gemm_chain makes 2 outputs but {len(self.out)} names are given", "out")
        return [TensorSpec(self.out[0], (a.shape[0], n), a.dtype),
                TensorSpec(self.out[1], (a.shape[0], b2.shape[0]), a.dtype)]


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
        if a.dtype in FP8_DTYPES:  # an fp8 sum has no scale to land in; add in bf16, quantize after
            ctx.fail(f"add of {a.dtype} operands: fp8 values carry scales an elementwise add cannot"
                     f" combine; add them in bf16/fp32 and quantize the sum", "a")
        return [_out(self, ctx, a.shape, a.dtype)]


class Extern(OpBase):
    """Opaque user code (the rest of a layer); bound to a callable at build time. One result
    (`shape`, `dtype`) or several (`shapes`, `dtypes`: one entry per output name)."""
    op: Literal["extern"]
    fn: str
    args: list[str] = Field(default_factory=list)
    shape: list[DimExpr] | None = None
    dtype: str = "bf16"
    shapes: list[list[DimExpr]] | None = Field(None, description="One shape per result (several results).")
    dtypes: list[str] | None = Field(None, description="One dtype per result (default: dtype for all).")
    cost_us: float | None = Field(None, description="Time estimate for the cost model.")
    side_stream: bool = Field(True, description="False: the code must run on the caller's stream (it syncs"
                              " with it or launches on it itself); the planner keeps it on main.")
    effects: bool = Field(False, description="True: the code runs for what it does beyond its results (writes a"
                          " KV cache); dce keeps it though nothing reads its results, and it stays on main.")
    writes: list[str] | None = Field(None, description="The arguments effects=true code writes in place (the KV"
                                     " cache); under torch.compile the plan's op declares those inputs written."
                                     " Default: every argument.")

    def inputs(self):
        return list(self.args)

    def n_outputs(self):
        return len(self.shapes) if self.shapes is not None else 1

    def result_specs(self) -> list[tuple[list, str]]:
        """[(shape, dtype)] of every result, as written."""
        if self.shapes is None:
            return [(list(self.shape or []), self.dtype)]
        dts = self.dtypes or [self.dtype] * len(self.shapes)
        return list(zip(self.shapes, dts, strict=False))

    def infer(self, ctx):
        for i, a in enumerate(self.args):
            ctx.tensor(a, ("args", i))
        if self.cost_us is not None and not self.cost_us >= 0:
            ctx.fail(f"cost_us must be >= 0 (microseconds), got {self.cost_us:g}", "cost_us", "type")
        for flag, on in (("side_stream=false", not self.side_stream), ("effects=true", self.effects)):
            if on and self.stream not in (None, "main"):
                ctx.fail(f"{flag} keeps this code on the caller's stream (main), but it is "
                         f"pinned to stream '{self.stream}'", "stream", "stream")
        if self.writes is not None:
            if not self.effects:
                ctx.fail("writes= names what effects=true code writes in place; add effects=true", "writes")
            for n in self.writes:
                if n not in self.args:
                    ctx.fail(f"writes= names '{n}', which is not an argument of this code (arguments:"
                             f" {', '.join(self.args) or 'none'})", "writes")
        if (self.shape is None) == (self.shapes is None):
            ctx.fail("extern needs exactly one of shape= (one result) or shapes= (several)", "shape")
        if self.shapes is not None:
            if not self.shapes:
                ctx.fail("shapes= needs at least one shape", "shapes")
            if len(self.out) != len(self.shapes):
                ctx.fail(f"shapes= declares {len(self.shapes)} results but {len(self.out)} output name(s) are given",
                         "shapes")
            if self.dtypes is not None and len(self.dtypes) != len(self.shapes):
                ctx.fail(f"dtypes= has {len(self.dtypes)} entries but shapes= has {len(self.shapes)}", "dtypes")
        elif self.dtypes is not None:
            ctx.fail("dtypes= goes with shapes= (several results); one result takes dtype=", "dtypes")
        outs = []
        for j, (shp, dt) in enumerate(self.result_specs()):
            f = "shape" if self.shapes is None else "shapes"
            shape = [ctx.dim(d, (f, i)) for i, d in enumerate(shp)]
            outs.append(_out(self, ctx, shape, ctx.dtype(dt, "dtypes" if self.dtypes else "dtype"), j))
        return outs


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
            outs.append(TensorSpec(name, tuple(shape), t.dtype, contiguous=contiguous, alias_of=t.alias_of or t.name,
                                   meta=carried_meta(t)))
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
        return [_out(self, ctx, shape, first.dtype, meta=carried_meta(*specs, pieces=True))]


class Slice(OpBase):
    """x[start:stop] along `dim` (a view). A negative constant bound counts from the end, as in
    Python: x[:, -8:] is the last 8 columns."""
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
        def from_end(v):  # a negative constant bound counts back from n
            if not isinstance(v, int) or v >= 0:
                return v
            return n + v if isinstance(n, int) else ctx.simplify(Bin("-", _lift(n), Num(-v)))
        written_start = ctx.dim(self.start, "start")
        written_stop = n if self.stop is None else ctx.dim(self.stop, "stop")
        start, stop = from_end(written_start), from_end(written_stop)
        ok = ctx.probes.holds(lambda b: 0 <= ctx.at(start, b) <= ctx.at(stop, b) <= ctx.at(n, b))
        if not ok:
            field = "start" if self.stop is None or not ctx.probes.holds(lambda b: 0 <= ctx.at(start, b) <= ctx.at(n, b)) else "stop"
            counted = "" if (start, stop) == (written_start, written_stop) else \
                f" (from the end: [{fmt_dim(start)}:{fmt_dim(stop)}])"
            ctx.fail(f"slice [{fmt_dim(written_start)}:{fmt_dim(written_stop)}]{counted} is out of bounds for dim {d}"
                     f" of '{self.x}' ({fmt_dim(n)}): the bounds must satisfy 0 <= start <= stop <= {fmt_dim(n)}"
                     " at every size the dims allow", field)
        # bounds counted from the end are stored as the bounds they are, so every reader of the op
        # (lowering, the weight views, chain fusion) sees what runs
        if start is not written_start:
            self.start = start if isinstance(start, int) else unparse(start)
        if stop is not written_stop:
            self.stop = stop if isinstance(stop, int) else unparse(stop)
        length = ctx.simplify(Bin("-", _lift(stop), _lift(start)))
        if self.stop is None and isinstance(written_start, int) and written_start < 0:
            length = -written_start  # x[-k:] has k rows at every size (the bounds check said so)
        shape = list(t.shape)
        shape[d] = length
        contiguous = t.contiguous and (d == 0 or all(x == 1 for x in t.shape[:d]))
        return [TensorSpec(self.out[0], tuple(shape), t.dtype, contiguous=contiguous, alias_of=t.alias_of or t.name,
                           meta=carried_meta(t))]


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
        return [_out(self, ctx, shape, t.dtype, meta=carried_meta(t))]


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
        return [_out(self, ctx, shape, t.dtype, meta=carried_meta(t))]


class Copy(OpBase):
    """Materialize `x` as a new contiguous tensor (optionally cast)."""
    op: Literal["copy"]
    x: str
    dtype: str | None = None

    def inputs(self):
        return [self.x]

    def infer(self, ctx):
        t = ctx.tensor(self.x, "x")
        return [_out(self, ctx, t.shape, ctx.dtype(self.dtype, "dtype") if self.dtype else t.dtype, meta=carried_meta(t))]


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
        return [TensorSpec(self.out[0], tuple(shape), t.dtype, alias_of=t.alias_of or t.name,
                           meta=carried_meta(t))]


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
        return [TensorSpec(self.out[0], first.shape, first.dtype, contiguous=all(s.contiguous for s in specs),
                           meta=carried_meta(*specs))]


Op = Annotated[
    AllGather | ReduceScatter | AllReduce | AllToAll | AllReduceAddRmsNorm | Gemm | GemmChain | Add | Extern | Split
    | Cat | Slice | Pad | Shard | Copy | View | Select | RmsNorm | AddRmsNorm | SiluAndMul | GeluAndMul | Mul | Rope
    | Quantize,
    Field(discriminator="op"),
]
OP_MODELS = {m.model_fields["op"].annotation.__args__[0]: m for m in
             (AllGather, ReduceScatter, AllReduce, AllToAll, AllReduceAddRmsNorm, Gemm, GemmChain, Add, Extern, Split,
              Cat, Slice, Pad, Shard, Copy, View, Select, RmsNorm, AddRmsNorm, SiluAndMul, GeluAndMul, Mul, Rope, Quantize)}
OP_KINDS = sorted(OP_MODELS)
USER_OPS = [k for k in OP_KINDS if k not in ("select", "gemm_chain")]  # those two are made by the planner
COLLECTIVES = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "all_reduce_add_rmsnorm"}
# collectives fuse-collectives packs into buckets (all_to_all: per-peer chunks would interleave;
# the fused all-reduce + norm is one kernel with its own inputs)
PACKABLE_COLLECTIVES = {"all_gather", "reduce_scatter", "all_reduce"}
VIEW_OPS = {"split", "slice", "view", "select"}
# ops whose results are computed (compared with a tolerance by `planner run --check`)
ARITH_OPS = {"gemm", "gemm_chain", "add", "reduce_scatter", "all_reduce", "all_reduce_add_rmsnorm", "rmsnorm",
             "add_rmsnorm", "silu_and_mul",
             "gelu_and_mul", "mul", "rope", "quantize"}
ELEMENT_BYTES = DTYPES
