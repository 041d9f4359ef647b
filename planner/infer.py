"""Shape and dtype inference over a plan's ops, in dependency order.

Ops may be written in any order; we order them by data dependencies, report
undefined tensors and cycles with locations, then let each op model infer its
outputs through InferCtx.
"""

from __future__ import annotations

from .errors import Loc, PlanError, did_you_mean
from .expr import MAX_AST_DEPTH, ExprError, Name, depth, eval_int, fold, free_names, parse
from .opbase import written_in_place
from .shapes import DTYPE_ALIASES, DTYPES, TensorSpec, fmt_dim, fmt_shape, unknown_dtype

__all__ = ["InferCtx", "infer_all", "topo_order"]


class _Fail(Exception):
    def __init__(self, message, field=None, code="shape", hint=None):
        self.message, self.field, self.code, self.hint = message, field, code, hint


class InferCtx:
    def __init__(self, tensors, params, dims, groups, probes):
        self.tensors = tensors
        self.params = params
        self.dims = dims
        self.groups = groups
        self.probes = probes
        self.op = None

    def fail(self, message, field=None, code="shape"):
        raise _Fail(message, field, code)

    def tensor(self, name: str, field) -> TensorSpec:
        t = self.tensors.get(name)
        if t is None:
            raise _Fail(f"unknown tensor '{name}'", field, "name")
        return t

    def group(self, name: str, field) -> int:
        if name not in self.groups:
            hint = did_you_mean(name, self.groups)
            raise _Fail(f"unknown group '{name}'" + (f" ({hint})" if hint else " (declare it under 'groups:')"), field, "name")
        return self.groups[name]

    def dtype(self, name: str, field) -> str:
        name = DTYPE_ALIASES.get(name, name)
        if name not in DTYPES:
            msg, hint = unknown_dtype(name)
            raise _Fail(msg, field, "type", hint or None)
        return name

    def dim(self, value, field):
        if isinstance(value, bool):
            raise _Fail("expected a dimension, got a boolean", field, "type")
        if isinstance(value, int):
            return value
        try:
            d = fold(parse(str(value)), self.params)
        except ExprError as e:
            raise _Fail(e.message, field, e.code) from None
        for n in free_names(d) if not isinstance(d, int) else ():
            if n not in self.dims:
                hint = did_you_mean(n, list(self.params) + list(self.dims))
                raise _Fail(f"unknown name '{n}' in '{value}'" + TUNED_IN_DIM * n.startswith("tuned.")
                            + (f" ({hint})" if hint else ""), field, "name")
        return d

    def simplify(self, e):
        try:
            return fold(e, {})
        except ExprError:
            return e

    @staticmethod
    def at(d, binding) -> int:
        return eval_int(d, binding)


def topo_order(ops, known: set, locs: dict, field_locs: dict):
    """Ops in dependency order (stable: plan order among ready ops)."""
    producer = {}
    for o in ops:
        for n in o.out:
            producer[n] = o
    indeg = {o.id: 0 for o in ops}
    users: dict[str, list] = {o.id: [] for o in ops}
    for o in ops:
        for n in o.inputs():
            if n in producer:
                p = producer[n]
                if p.id == o.id:
                    raise PlanError.at(locs.get(o.id), "cycle", f"op '{o.id}' reads its own output '{n}'")
                indeg[o.id] += 1
                users[p.id].append(o)
            elif n not in known:
                candidates = list(known) + list(producer)
                loc = _field_loc(o, n, locs, field_locs)
                raise PlanError.at(loc, "name", f"{o.op} '{o.id}' reads undefined tensor '{n}'",
                                   did_you_mean(n, candidates))
    import heapq
    index = {o.id: i for i, o in enumerate(ops)}
    ready = [(index[o.id], o.id) for o in ops if indeg[o.id] == 0]
    heapq.heapify(ready)
    by_id = {o.id: o for o in ops}
    order = []
    while ready:
        _, oid = heapq.heappop(ready)
        o = by_id[oid]
        order.append(o)
        for u in users[oid]:
            indeg[u.id] -= 1
            if indeg[u.id] == 0:
                heapq.heappush(ready, (index[u.id], u.id))
    if len(order) != len(ops):
        left = [o for o in ops if indeg[o.id] > 0]
        cycle = _find_cycle(left, producer)
        first = cycle[0]
        raise PlanError.at(locs.get(first), "cycle", "ops form a dependency cycle: " + " -> ".join(cycle + [first]))
    return order


def _find_cycle(left, producer):
    ids = {o.id for o in left}
    succ = {o.id: [producer[n].id for n in o.inputs() if n in producer and producer[n].id in ids] for o in left}
    # walk predecessors until a node repeats
    start = left[0].id
    path, seen = [start], {start: 0}
    cur = start
    while True:
        nxt = succ[cur][0]
        if nxt in seen:
            cyc = path[seen[nxt]:]
            return list(reversed(cyc))
        seen[nxt] = len(path)
        path.append(nxt)
        cur = nxt


_NOT_TENSOR_FIELDS = {"id", "out", "stream", "doc", "op", "fn", "group", "backend", "region", "variants", "dtype",
                      "dtypes", "out_dtype"}


def _field_loc(op, name, locs, field_locs) -> Loc | None:
    fl = field_locs.get(op.id, {})
    for f in type(op).model_fields:  # the field that names it (scale_a=..., positions=...)
        if f in _NOT_TENSOR_FIELDS:
            continue
        v = getattr(op, f, None)
        if v == name or (isinstance(v, list) and name in v):
            return fl.get(f, locs.get(op.id))
    return locs.get(op.id)


# a tuned limit where a dim is expected (splits=min(n, tuned.cap)): what to write instead
TUNED_IN_DIM = ("; tuned limits are read by gates only: a dim or split size takes params and dims"
                " (declare the measured cap as a param, e.g. min(num_tokens * topk, cap))")

# how the ops that can make more results are asked for them
_MORE_RESULTS = {
    "all_to_all": " (the received counts are a second result only with counts=...)",
    "extern": " (several results are declared with shapes=[[...], [...]], not shape=)",
}


def infer_all(ops, tensors, params, dims, groups, probes, locs, field_locs):
    ctx = InferCtx(tensors, params, dims, groups, probes)
    for op in topo_order(ops, set(tensors), locs, field_locs):
        ctx.op = op
        try:
            specs = op.infer(ctx)
        except _Fail as f:
            key = f.field[0] if isinstance(f.field, tuple) else f.field
            loc = field_locs.get(op.id, {}).get(key) or locs.get(op.id)
            raise PlanError.at(loc, f.code, f"{op.op} '{op.id}': {f.message}", f.hint) from None
        except ExprError as e:  # a budget of the expression language (evaluation steps)
            raise PlanError.at(locs.get(op.id), e.code, f"{op.op} '{op.id}': {e.message}") from None
        if len(op.out) > len(specs):
            loc = field_locs.get(op.id, {}).get("out") or locs.get(op.id)
            raise PlanError.at(loc, "shape", f"{op.op} '{op.id}': makes {len(specs)} tensor(s) but"
                               f" {len(op.out)} output names are given{_MORE_RESULTS.get(op.op, '')}")
        for s in specs:
            # symbolic dims grow with every pad/cat/slice of a dynamic dim: bound their depth here so
            # that no later walk over them can recurse without limit
            for d in s.shape:
                if not isinstance(d, (int, Name)) and depth(d, MAX_AST_DEPTH + 1) > MAX_AST_DEPTH:
                    raise PlanError.at(locs.get(op.id), "limit", f"{op.op} '{op.id}': a dim of '{s.name}' is an"
                                       f" expression more than {MAX_AST_DEPTH} levels deep (budget 'expr-depth');"
                                       " a long chain of pad/cat/slice over a dynamic dim")
            _nonnegative(op, s, probes, locs, field_locs)
            if s.name in tensors:
                raise PlanError.at(locs.get(op.id), "dup", f"tensor '{s.name}' is defined twice")
            s.producer = op.id
            tensors[s.name] = s


def _may_share(o, n, by_id, tensors, readers, outs, loc) -> None:
    """An in-place operand that is a region output is whichever variant's value ran: each must be
    one the write may change (made by the plan, not a view, read by no other op, not a plan
    output). Ops that hand back their input only at some sizes (a shard without padding, a
    collective over one rank, model code) are copied by the executor before such a write."""
    todo, seen = [(n, "")], {n}
    while todo:
        m, how = todo.pop()
        p = by_id.get(tensors[m].producer)
        if p is None or p.op != "select":
            continue
        nxt = [(c, f"variant '{v}' of region '{p.region}' makes it as '{c}'") for c, v in
               zip(p.choices, p.variants or [""] * len(p.choices), strict=False)]
        for c, why in nxt:
            if c in seen:
                continue
            seen.add(c)
            t, why = tensors[c], why if not how else f"{how}; {why}"
            if t.producer is None:
                problem = f"may be plan {t.kind} '{c}' itself ({why}); only values the plan makes can be overwritten"
            elif t.alias_of is not None and not t.meta.get("inplace") or not t.contiguous:
                problem = f"may be a view ({why}); writing it would change the tensor it views"
            elif other := next((r for r in readers.get(c, []) if r != p.id), None):
                problem = f"may be '{c}' ({why}), which '{other}' also reads"
            elif c in outs:
                problem = f"may be '{c}' ({why}), a plan output"
            else:
                todo.append((c, why))
                continue
            raise PlanError.at(loc, "shape", f"{o.op} '{o.id}': inplace overwrites '{n}', which {problem};"
                               " drop inplace or copy it first")


def _nonnegative(op, s, probes, locs, field_locs) -> None:
    """Every dim an op makes is >= 0 at every probe: an extern's shape=, split sizes and view dims
    are written by hand, and a negative one would only fail inside an allocator at run time."""
    for i, d in enumerate(s.shape):
        field = next((f for f in ("shape", "shapes", "sizes") if f in field_locs.get(op.id, {})), None)
        loc = field_locs.get(op.id, {}).get(field) if field else None
        bad = []
        for b in probes.bindings if not isinstance(d, int) else [{}]:
            try:
                v = eval_int(d, b)
            except ExprError as e:  # num_tokens / 2 at an odd size, % 0, an overflow
                at = ", ".join(f"{k}={x}" for k, x in b.items())
                raise PlanError.at(loc or locs.get(op.id), e.code, f"{op.op} '{op.id}': dim {i} of '{s.name}'"
                                   f" ({fmt_dim(d)}): {e.message}" + (f" at {at}" if at else ""), e.hint) from None
            if v < 0:
                bad.append(b)
                break
        if bad:
            at = ", ".join(f"{k}={v}" for k, v in bad[0].items())
            raise PlanError.at(loc or locs.get(op.id), "shape", f"{op.op} '{op.id}': dim {i} of '{s.name}'"
                               f" {fmt_shape(s.shape)} is {fmt_dim(d)}, negative" + (f" at {at}" if at else "")
                               + "; sizes must be >= 0 at every size the dims allow")


def _exclusive(ctx_a, ctx_b) -> bool:
    """Two ops in different variants of one region: at most one of them runs in a call."""
    va = dict(ctx_a or ())
    return any(r in va and va[r] != v for r, v in ctx_b or ())


def check_inplace(ops, tensors, outputs, locs, field_locs, op_ctx=None) -> None:
    """Ops that overwrite inputs (add_rmsnorm inplace: true) must be their inputs' only readers:
    no other op may read them or a view of them, and they must not be plan outputs."""
    writers = [o for o in ops if written_in_place(o)]
    if not writers:
        return
    written = {o.id for o in writers}

    def root(n):  # the storage a name reads; an in-place result is a new value, not its input
        seen = 0
        while tensors[n].alias_of and tensors[n].producer not in written and seen < 64:
            n, seen = tensors[n].alias_of, seen + 1
        return n
    readers: dict[str, list] = {}
    for o in ops:
        for n in set(o.inputs()):
            if n in tensors:
                readers.setdefault(root(n), []).append(o.id)
    outs = {root(n) for n in outputs if n in tensors}
    by_id = {o.id: o for o in ops}
    ctx = op_ctx or {}
    for o in writers:
        if o.op == "add_rmsnorm" and root(o.x) == root(o.residual):
            loc = field_locs.get(o.id, {}).get("residual") or locs.get(o.id)
            raise PlanError.at(loc, "shape", f"{o.op} '{o.id}': inplace writes x + residual into '{o.residual}' and"
                               f" the normalized result into '{o.x}', which are the same storage; drop inplace or"
                               " give two different tensors")
        for field in o.INPLACE_FIELDS:
            n = getattr(o, field)
            loc = field_locs.get(o.id, {}).get(field) or locs.get(o.id)
            _may_share(o, n, by_id, tensors, readers, outs, loc)
            # a reader in another variant of a region the writer's variant belongs to never runs beside it
            others = [r for r in readers.get(n, []) if r != o.id and not _exclusive(ctx.get(o.id), ctx.get(r))]
            if others:
                raise PlanError.at(loc, "shape", f"{o.op} '{o.id}': inplace overwrites '{n}', which '{others[0]}'"
                                   " also reads; drop inplace or copy it first: an in-place op must be the only reader of what it"
                                   " overwrites")
            if n in outs:
                raise PlanError.at(loc, "shape", f"{o.op} '{o.id}': inplace overwrites '{n}', a plan output")
