"""The validated plan: what the loader produces and the planner consumes."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import Loc
from .expr import Expr, unparse
from .shapes import TensorSpec

__all__ = ["Variant", "Region", "DimSpec", "Plan"]


@dataclass
class Variant:
    name: str
    when: Expr | None          # gate after folding params; None = fallback
    when_src: str | None       # as written
    loc: Loc | None = None
    static: bool | None = None  # gate folded to a constant at compile time
    uses: set = field(default_factory=set)

    @property
    def when_text(self) -> str | None:
        return None if self.when is None else unparse(self.when)


@dataclass
class Region:
    id: str
    variants: list[Variant]
    outputs: list[str]          # exported names (each made by a select op)
    inputs: list[str] = field(default_factory=list)
    loc: Loc | None = None
    within: tuple = ()          # ((region, variant), ...) it is nested in, outermost first

    @property
    def fallback(self) -> Variant:
        return self.variants[-1]


@dataclass
class DimSpec:
    name: str
    lo: int
    hi: int
    buckets: list[int]


@dataclass
class Plan:
    name: str
    file: str
    params: dict
    dims: dict[str, DimSpec]
    groups: dict[str, int]
    tuned: dict[str, int]
    tensors: dict[str, TensorSpec]
    inputs: list[str]
    weights: list[str]
    outputs: list[str]
    ops: list                    # op models, in plan order
    regions: dict[str, Region]
    op_ctx: dict[str, tuple]     # op id -> ((region, variant), ...) guards, outermost first
    locs: dict[str, Loc]         # op id / tensor name -> where it was written
    doc: str | None = None
    streams: list[str] | None = None  # declared streams (main first); None = main + the planner's pool
    includes: list[str] = field(default_factory=list)
    group_params: dict[str, list[str]] = field(default_factory=dict)  # group -> params its size is written with
    param_choices: dict[str, list] = field(default_factory=dict)     # param -> its declared choices

    def op(self, op_id: str):
        for o in self.ops:
            if o.id == op_id:
                return o
        raise KeyError(op_id)

    @property
    def token_dim(self) -> str | None:
        """The dim every cost scales with: `num_tokens` where declared, else the first dim."""
        return "num_tokens" if "num_tokens" in self.dims else next(iter(self.dims), None)

    def dim_ranges(self) -> dict[str, tuple[int, int]]:
        return {k: (d.lo, d.hi) for k, d in self.dims.items()}
