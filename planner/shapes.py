"""Tensor specs, dtypes and symbolic-dim comparisons.

A dim is an int or an Expr over dynamic dims (after params are folded in).
Two symbolic dims are compared by evaluating both at probe points spread over
the declared dim ranges: cheap, exact for the affine/ceil_div forms plans use,
and it never needs a computer-algebra system.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .expr import Expr, ExprError, eval_int, unparse

__all__ = ["DTYPES", "FP8_DTYPES", "TensorSpec", "Probes", "fmt_dim", "fmt_shape", "numel_at", "nbytes_at",
           "unknown_dtype"]

# element bytes; fp8_e4m3 is OCP e4m3fn (max 448, no inf), fp8_e5m2 the OCP e5m2 format
DTYPES = {"bf16": 2, "fp16": 2, "fp32": 4, "int32": 4, "int64": 8, "int8": 1, "uint8": 1,
          "fp8_e4m3": 1, "fp8_e5m2": 1}
FP8_DTYPES = {"fp8_e4m3", "fp8_e5m2"}
DTYPE_ALIASES = {
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
    "int": "int32", "float8_e4m3fn": "fp8_e4m3", "e4m3": "fp8_e4m3", "float8_e5m2": "fp8_e5m2", "e5m2": "fp8_e5m2",
}


def unknown_dtype(name) -> tuple[str, str]:
    """(message, hint) for a dtype that is not one of ours: the valid ones, and the closest."""
    import difflib
    low = str(name).lower()
    if low.startswith(("fp8", "float8", "f8", "e4m3", "e5m2")):  # some fp8: e5m2 if it says so, else e4m3
        got = ["fp8_e5m2" if "e5" in low or "m2" in low else "fp8_e4m3"]
    else:
        got = difflib.get_close_matches(low, list(DTYPES) + list(DTYPE_ALIASES), n=1, cutoff=0.5)
    c = DTYPE_ALIASES.get(got[0], got[0]) if got else None
    msg = f"unknown dtype {str(name)!r} (valid: {', '.join(DTYPES)})"
    return msg, (f"did you mean '{c}'?" if c else "")

Dim = int | Expr


def fmt_dim(d) -> str:
    return str(d) if isinstance(d, int) else unparse(d)


def fmt_shape(shape) -> str:
    return "[" + ", ".join(fmt_dim(d) for d in shape) + "]"


SCALE_BLOCK = 128  # DeepSeek-V3 block scales: 1x128 activation groups, 128x128 weight blocks


@dataclass
class TensorSpec:
    name: str
    shape: tuple
    dtype: str
    kind: str = "value"  # input | weight | value
    contiguous: bool = True
    producer: str | None = None  # op id; None for inputs and weights
    alias_of: str | None = None  # views share storage with this tensor
    meta: dict = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def to_json(self) -> dict:
        return {"shape": [fmt_dim(d) if not isinstance(d, int) else d for d in self.shape], "dtype": self.dtype}


class Probes:
    """Bindings of dynamic dims at which symbolic dims are compared."""

    def __init__(self, dims: dict[str, tuple[int, int]]):
        self.dims = dims
        columns = {}
        for name, (lo, hi) in dims.items():
            vals = {lo, hi, lo + 1, hi - 1, (lo + hi) // 2, 7, 13, 31, 100, 1000, 4097}
            columns[name] = sorted(v for v in vals if lo <= v <= hi)
        n = max((len(v) for v in columns.values()), default=1)
        self.bindings = [{k: v[i % len(v)] for k, v in columns.items()} for i in range(n)]
        # corners, so a dim at its min meets another at its max
        if 1 < len(dims) <= 4:
            import itertools
            for combo in itertools.product(*[(lo, hi) for lo, hi in dims.values()]):
                self.bindings.append(dict(zip(dims, combo, strict=True)))
        self.upper = {k: hi for k, (lo, hi) in dims.items()}
        self.lower = {k: lo for k, (lo, hi) in dims.items()}

    def values(self, d) -> list[int]:
        if isinstance(d, int):
            return [d]
        return [eval_int(d, b) for b in self.bindings]

    def equal(self, a, b) -> bool:
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        if a == b:
            return True
        try:
            return all(eval_int(a, x) == eval_int(b, x) for x in self.bindings)
        except ExprError:
            return False

    def holds(self, pred) -> bool:
        """pred(binding) is true at every probe."""
        return all(pred(b) for b in self.bindings)

    def at_max(self, d) -> int:
        return eval_int(d, self.upper)


def numel_at(shape, bindings: dict) -> int:
    n = 1
    for d in shape:
        n *= eval_int(d, bindings)
    return n


def nbytes_at(spec: TensorSpec, bindings: dict) -> int:
    return numel_at(spec.shape, bindings) * DTYPES[spec.dtype]
