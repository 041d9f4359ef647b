"""The base of every op model and the helpers their inference shares.

planner/ops.py (collectives, gemm, data movement), planner/ops_pointwise.py (norms,
activations, rope) and planner/ops_fp8.py (quantize, scale layouts) build on it;
planner/ops.py holds the discriminated union of them all.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .expr import Bin, Num
from .shapes import DTYPE_ALIASES, SCALE_BLOCK, TensorSpec, fmt_dim, fmt_shape

__all__ = ["OpBase", "DimExpr", "Backend", "lift", "norm_dim", "out_spec", "same_shape", "written_in_place"]

DimExpr = int | str
# what an op's `backend:` may name; "inductor" is torch.compile of the torch reference
Backend = Literal["auto", "torch", "cute", "flashinfer", "inductor"]


def lift(d):
    return Num(d) if isinstance(d, int) else d


class OpBase(BaseModel):
    # a kind's validator is built when it is first used: a plan names a few of the kinds
    model_config = ConfigDict(extra="forbid", frozen=False, defer_build=True)

    id: str = Field("", description="Unique op id; defaults to the first output's name.")
    out: list[str] = Field(default_factory=list, description="Output tensor names ('_' discards).")
    stream: str | None = Field(None, description="Pin the op to a stream; otherwise the planner decides.")
    doc: str | None = Field(None, description="Free text shown in reports and pictures.")

    # dtypes are stored by their canonical names (float16 -> fp16, e5m2 -> fp8_e5m2), as the
    # tensors' are: lowering, reports and hashes read the op's fields, not the inferred spec
    @field_validator("dtype", "out_dtype", "dtypes", mode="before", check_fields=False)
    @classmethod
    def _canonical_dtype(cls, v):
        if isinstance(v, str):
            return DTYPE_ALIASES.get(v, v)
        if isinstance(v, list):
            return [DTYPE_ALIASES.get(x, x) if isinstance(x, str) else x for x in v]
        return v

    # fields naming the operands `inplace: true` writes over (the norms'); none elsewhere
    INPLACE_FIELDS: ClassVar[tuple[str, ...]] = ()

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


def norm_dim(ctx, spec: TensorSpec, dim: int, field: str = "dim") -> int:
    r = spec.rank
    if not -r <= dim < r:
        ctx.fail(f"dim {dim} does not exist: '{spec.name}' has rank {r} {fmt_shape(spec.shape)}", field)
    return dim % r


def out_spec(self, ctx, shape, dtype, i: int = 0, **kw) -> TensorSpec:
    """The i-th output's spec (named by `out`, or the op id for a lone unnamed output)."""
    return TensorSpec(self.out[i] if len(self.out) > i else self.id, tuple(shape), dtype, **kw)


def carried_meta(*specs: TensorSpec, pieces: bool = False) -> dict:
    """What stays true of a tensor whose elements are elements of these, moved (copies, slices,
    views, gathers, shards, region outputs): quantize's `scale_group`, the K elements one scale
    covers, which a gemm reads its scales by. One of several tensors (a region output: one variant's
    runs) keeps a group other than 128 where they differ, so the gemm refuses what one variant
    would read wrong; `pieces` (a cat: all of them, side by side) keeps a group only where every
    piece has it, since a split of the cat (a packed collective's unpacking) hands it to each piece."""
    groups = [s.meta.get("scale_group") for s in specs]
    if pieces:
        return {"scale_group": groups[0]} if groups and groups[0] is not None and len(set(groups)) == 1 else {}
    known = {g for g in groups if g is not None}
    if not known:
        return {}
    return {"scale_group": max(known, key=lambda g: (g != SCALE_BLOCK, g))}


def same_shape(ctx, a: TensorSpec, b: TensorSpec) -> bool:
    return a.rank == b.rank and all(ctx.probes.equal(x, y) for x, y in zip(a.shape, b.shape, strict=True))


def mul_dim(ctx, d, k: int):
    return d * k if isinstance(d, int) else ctx.simplify(Bin("*", lift(d), Num(k)))


def check_outs(self, ctx, n: int) -> None:
    if len(self.out) != n:
        ctx.fail(f"{self.op} makes {n} tensors but {len(self.out)} output name(s) are given", "out")


def fmt(d) -> str:
    return fmt_dim(d)


def written_in_place(op) -> list[str]:
    """The operands an op with inplace=true writes over (its INPLACE_FIELDS: x and residual of
    add_rmsnorm, residual alone of the fused all-reduce + norm); cat's `inplace` lists members
    already written into its buffer, not writes of its own."""
    if getattr(op, "inplace", False) is not True:
        return []
    return [getattr(op, f) for f in op.INPLACE_FIELDS if getattr(op, f, None)]
