"""Run-time values of symbolic dims: op attributes and tensor shapes at this call's bindings.

Plans write sizes as ints, param names or expressions over params and dynamic dims
("3 * head_cols", "num_tokens", "ceil_div(num_tokens, tp_size)"). They are folded
against params once at build time; what is left is evaluated per call.

DimSolver binds the dynamic dims of a call from the input shapes:
  - an input dim that is a bare dim name (x: [num_tokens, hidden]) binds directly;
  - a derived input dim (final: [ceil_div(num_tokens, tp_size), hidden]) does not
    determine num_tokens uniquely (17..24 all give 3 at tp 8), so the caller passes
    it: `executor(dims={"num_tokens": 19}, ...)`. Without it the solver searches the
    dim's declared range and accepts only a unique solution; an ambiguous or empty
    search is an error that says to pass dims=.
Every binding is checked against every input shape and the declared range. Results
are cached per (input shapes, given dims), so a steady-state call costs a dict lookup.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.expr import Expr, eval_int, fold, free_names, parse, unparse

__all__ = ["dim_fn", "shape_fn", "DimSolver", "DimError"]


class DimError(ValueError):
    """Inputs do not fit the plan's declared shapes, or dims cannot be determined."""


def _const(v: int) -> Callable[[dict], int]:
    return lambda b: v


def dim_fn(value, params: dict) -> Callable[[dict], int]:
    """int | str | Expr -> f(bindings) -> int, folded against params once."""
    if isinstance(value, bool):
        raise TypeError(f"dim {value!r} is not an integer")
    if isinstance(value, int):
        return _const(value)
    e = parse(value) if isinstance(value, str) else value
    folded = fold(e, params)
    if isinstance(folded, int):
        return _const(folded)
    if hasattr(folded, "id") and type(folded).__name__ == "Name":
        n = folded.id
        return lambda b: b[n]
    return lambda b: eval_int(folded, b)


def shape_fn(shape, params: dict) -> Callable[[dict], tuple]:
    fns = [dim_fn(d, params) for d in shape]
    if all(isinstance(d, int) for d in shape):
        t = tuple(shape)
        return lambda b: t
    return lambda b: tuple(f(b) for f in fns)


class DimSolver:
    def __init__(self, plan, input_names: list[str]):
        self.plan = plan
        self.inputs = list(input_names)
        self.direct: list[tuple[str, int, str]] = []
        self.derived: list[tuple[str, int, Expr]] = []
        self.fixed: list[tuple[str, int, int]] = []
        for name in self.inputs:
            for ax, d in enumerate(plan.tensors[name].shape):
                if isinstance(d, int):
                    self.fixed.append((name, ax, d))
                elif type(d).__name__ == "Name" and d.id in plan.dims:
                    self.direct.append((name, ax, d.id))
                else:
                    self.derived.append((name, ax, d))
        bound = {n for _, _, n in self.direct}
        self.unbound = sorted({n for _, _, e in self.derived for n in free_names(e)} - bound)
        self._cache: dict = {}

    def solve(self, tensors: dict, given: dict | None) -> dict:
        key = (tuple(tuple(tensors[n].shape) for n in self.inputs), tuple(sorted(given.items())) if given else None)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        out = self._solve(tensors, dict(given or {}))
        if len(self._cache) > 4096:  # bounded: shapes come from a finite bucket set in practice
            self._cache.clear()
        self._cache[key] = out
        return out

    def _solve(self, tensors: dict, b: dict) -> dict:
        for name in self.inputs:
            t, spec = tensors[name], self.plan.tensors[name]
            if len(t.shape) != len(spec.shape):
                raise DimError(f"input '{name}' has rank {len(t.shape)} but the plan declares {len(spec.shape)}")
        for name, ax, want in self.fixed:
            got = tensors[name].shape[ax]
            if got != want:
                raise DimError(f"input '{name}' dim {ax} is {got} but the plan declares {want}")
        for name, ax, dname in self.direct:
            got = int(tensors[name].shape[ax])
            if dname in b and b[dname] != got:
                raise DimError(f"input '{name}' dim {ax} is {got} but {dname} = {b[dname]}")
            b[dname] = got
        for dname in self.unbound:
            if dname not in b:
                b[dname] = self._search(dname, tensors, b)
        for name, ax, e in self.derived:
            got = int(tensors[name].shape[ax])
            want = eval_int(e, b)
            if got != want:
                raise DimError(f"input '{name}' dim {ax} is {got} but {unparse(e)} = {want} at "
                               + ", ".join(f"{k}={v}" for k, v in sorted(b.items())))
        for dname, spec in self.plan.dims.items():
            if dname in b and not spec.lo <= b[dname] <= spec.hi:
                raise DimError(f"{dname} = {b[dname]} is outside the plan's range {spec.lo}..{spec.hi}")
        missing = [d for d in self.plan.dims if d not in b]
        if missing:
            raise DimError(f"dim(s) {', '.join(missing)} appear in no input shape; pass dims={{'{missing[0]}': ...}}")
        return b

    def _search(self, dname: str, tensors: dict, b: dict) -> int:
        spec = self.plan.dims[dname]
        checks = [(n, ax, e) for n, ax, e in self.derived if free_names(e) <= set(b) | {dname}]
        sols = []
        for v in range(spec.lo, spec.hi + 1):
            trial = {**b, dname: v}
            if all(eval_int(e, trial) == int(tensors[n].shape[ax]) for n, ax, e in checks):
                sols.append(v)
                if len(sols) > 1:
                    break
        if len(sols) == 1:
            return sols[0]
        shapes = ", ".join(f"{n}{tuple(tensors[n].shape)}" for n in dict.fromkeys(n for n, _, _ in checks))
        if not sols:
            raise DimError(f"no {dname} in {spec.lo}..{spec.hi} fits the input shapes {shapes}")
        raise DimError(f"{dname} is ambiguous from the input shapes {shapes} (e.g. {sols[0]} or {sols[1]});"
                       f" pass dims={{'{dname}': N}} to the executor call")
