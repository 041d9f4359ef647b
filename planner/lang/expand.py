"""Expanding a plan's op bodies into a flat list of raw op dicts.

Handles `for:` loops, `{expr}` name interpolation, reusable blocks (inlined with
their own name scope), regions with gated variants (each exported name becomes a
`select` op), and the compact call form `outs: op(args, kw=...)` including nested
calls and `x[a:b]` slices, which become anonymous ops.
"""

from __future__ import annotations

import math
import re
from collections import ChainMap
from dataclasses import dataclass, field

from ..errors import Loc, PlanError, did_you_mean
from ..expr import (
    Call,
    ExprError,
    Index,
    ListE,
    Name,
    Num,
    Slice,
    current_budget,
    evaluate,
    free_names,
    parse,
    unparse,
)
from ..ops import OP_MODELS, USER_OPS
from .yamlsrc import Source

__all__ = ["RawOp", "RegionRaw", "Expander"]

RESERVED = {"for", "ops", "op", "region", "variants", "outputs", "when", "name"}
# budgets of the expansion (docs/plan-language.md#limits): 120,000 ops load in about 3 s
MAX_OPS = 120_000
MAX_BLOCK_DEPTH = 16
MAX_VARIANTS = 64         # per region: gates are tried in order at every call
MAX_REGIONS = 20_000

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # ASCII: the expression language reads no other letters
T, TL, S, INT, D, DL, F, STR = "tensor", "tensors", "symbol", "int", "dim", "dims", "float", "text"
DLL, SL, B, IL = "dim lists", "symbols", "bool", "ints"
FIELD_KINDS = {
    "x": T, "a": T, "b": T, "xs": TL, "args": TL, "group": S, "dim": INT, "reduce": S,
    "out_dtype": S, "backend": S, "dtype": S, "fn": S, "sizes": DL, "start": D, "stop": D,
    "multiple": D, "shape": DL, "cost_us": F, "stream": S, "id": S, "doc": STR,
    # fp8, norms, activations, rope, all_to_all, several extern results
    "scale_a": T, "scale_b": T, "w": T, "residual": T, "eps": F, "inplace": B, "approximate": S,
    "q": T, "k": T, "positions": T, "cos_sin_cache": T, "interleave": B, "block": IL,
    "splits": D, "counts": T, "shapes": DLL, "dtypes": SL, "side_stream": B,
    "effects": B, "writes": TL,
}
POSITIONAL = {
    "all_gather": ["x", "group", "dim"], "reduce_scatter": ["x", "group", "dim"],
    "all_reduce": ["x", "group"], "gemm": ["a", "b"], "add": ["a", "b"],
    "split": ["x", "sizes", "dim"], "cat": ["xs", "dim"], "slice": ["x", "dim", "start", "stop"],
    "pad": ["x", "multiple", "dim"], "shard": ["x", "group", "dim"], "copy": ["x"],
    "view": ["x", "shape"], "extern": ["fn", "*args"],
    "all_to_all": ["x", "group"], "rmsnorm": ["x", "w", "eps"], "add_rmsnorm": ["x", "residual", "w", "eps"],
    "silu_and_mul": ["x"], "gelu_and_mul": ["x"], "mul": ["a", "b"],
    "rope": ["q", "k", "positions", "cos_sin_cache"], "quantize": ["x", "dtype"],
    "all_reduce_add_rmsnorm": ["x", "residual", "w", "group", "eps"],
}
_INTERP = re.compile(r"\{([^{}]*)\}")
FOR_CLAUSE = re.compile(r"^\s*([A-Za-z_]\w*)\s+in\s+(.+)$", re.S)


@dataclass(frozen=True)
class _SubstLoc(Loc):
    """A Loc of text written with {expr} substitutions: shift() takes a column of the substituted
    text to the written one (inside a substitution: its '{')."""
    spans: tuple = ()

    def shift(self, dcol: int) -> Loc:
        orig = dcol
        for start, end, ostart, oend in self.spans:
            if dcol < start:
                break
            orig = ostart if dcol < end else dcol - end + oend
        return Loc(self.file, self.line, self.col + orig)


@dataclass
class RawOp:
    d: dict                      # fields for the pydantic op model
    loc: Loc
    field_locs: dict = field(default_factory=dict)  # field name -> Loc
    ctx: tuple = ()              # ((region, variant), ...)


@dataclass
class RegionRaw:
    id: str
    variants: list               # [(name, when_src, when_loc, loc)]
    outputs: list                # exported actual names
    loc: Loc
    names: dict = field(default_factory=dict)  # tensor names visible to the gates -> actual names
    within: tuple = ()           # ((region, variant), ...) the region sits in, outermost first


@dataclass
class Scope:
    prefix: str
    names: dict
    parent: Scope | None
    ctx: tuple = ()
    exported: dict = field(default_factory=dict)  # local name -> actual name that a select defines

    def resolve(self, n: str) -> str:
        s = self
        while s is not None:
            if n in s.names:
                return s.names[n]
            s = s.parent
        return n

    def visible(self) -> set:
        out, s = set(), self
        while s is not None:
            out |= set(s.names)
            s = s.parent
        return out


class ScopeView:
    """Read-only mapping of the names visible in a scope (and its parents) to their actual names."""

    def __init__(self, scope: Scope):
        self.scope = scope

    def __contains__(self, n) -> bool:
        s = self.scope
        while s is not None:
            if n in s.names:
                return True
            s = s.parent
        return False

    def get(self, n, default=None):
        return self.scope.resolve(n) if n in self else default

    def __iter__(self):
        return iter(self.scope.visible())


@dataclass
class Entry:
    item: object
    env: dict
    path: tuple
    src: Source


class Expander:
    def __init__(self, params: dict, blocks: dict, op_kinds=USER_OPS, dims=()):
        self.params = params
        self.dims = set(dims)     # their names: a dim where a static integer is needed is said so
        self.blocks = blocks      # name -> (doc dict, Source, path)
        self.ops: list[RawOp] = []
        self.regions: list[RegionRaw] = []
        self.region_locs: dict[str, object] = {}  # region id -> where it was first written
        self.instances: dict[str, int] = {}
        self.instance_locs: dict[str, object] = {}  # block call id= -> where it was given
        self.block_stack: list[str] = []
        self.globals: set = set()
        self.empty_loops: list = []  # [(loc, 'VAR in EXPR', values)] of 'for' blocks that expanded to nothing

    # ------------------------------------------------------------ helpers

    def interp_located(self, text: str, env: dict, loc: Loc) -> tuple[str, Loc]:
        """interp, and a loc whose shifts (positions in the substituted text) land on the source's
        columns: x{L} written is x0 read, so later columns move back by the difference."""
        out = self.interp(text, env, loc)
        if out == text or not loc.line:
            return out, loc
        spans, delta = [], 0  # (start, end) in the substituted text -> start in the written one
        for m in _INTERP.finditer(text):
            start = m.start() + delta
            value = self.interp(m.group(0), env, loc)
            spans.append((start, start + len(value), m.start(), m.end()))
            delta += len(value) - (m.end() - m.start())
        return out, _SubstLoc(loc.file, loc.line, loc.col, tuple(spans))

    def interp(self, text: str, env: dict, loc: Loc) -> str:
        if "{" not in text:
            return text

        def sub(m):
            try:
                v = evaluate(parse(m.group(1)), env)
            except ExprError as e:
                raise PlanError.at(loc.shift(m.start() + 1 + e.pos), e.code, f"in '{{{m.group(1)}}}': {e.message}", e.hint) from None
            if isinstance(v, bool) or not isinstance(v, (int, str)):
                raise PlanError.at(loc.shift(m.start()), "type", f"'{{{m.group(1)}}}' must give an integer or a string")
            return str(v)
        return _INTERP.sub(sub, text)

    def loop_values(self, spec: str, env: dict, loc: Loc):
        m = FOR_CLAUSE.match(spec) if isinstance(spec, str) else None
        if not m:
            raise PlanError.at(loc, "schema", f"'for:' needs 'VAR in EXPR', got {spec!r}")
        var, src = m.group(1), m.group(2)
        if var in self.params:
            raise PlanError.at(loc, "dup", f"loop variable '{var}' shadows the param of the same name")
        try:
            vals = evaluate(parse(src), env)
        except ExprError as e:
            raise PlanError.at(loc.shift(m.start(2) + e.pos), e.code, e.message, e.hint) from None
        if not isinstance(vals, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            raise PlanError.at(loc.shift(m.start(2)), "type", f"'{src}' must give a list of integers")
        return var, vals

    def flatten(self, items, env, path, src: Source) -> list[Entry]:
        """Expand `for:` loops; returns entries in order."""
        if isinstance(items, dict):  # ops written as a mapping
            items = [{k: v} for k, v in items.items()]
            keyed = True
        else:
            keyed = False
        if not isinstance(items, list):
            raise PlanError.at(src.loc(path), "schema", "'ops' must be a list (or a mapping of outputs to calls)")
        out = []
        for i, item in enumerate(items):
            p = path + ((next(iter(item)),) if keyed else (i,))
            if isinstance(item, dict) and "for" in item:
                extra = set(item) - {"for", "ops"}
                if extra:
                    raise PlanError.at(src.loc(p + (sorted(extra)[0],)), "schema",
                                       f"unknown key '{sorted(extra)[0]}' in a 'for' block (expected 'for' and 'ops')")
                if "ops" not in item:
                    raise PlanError.at(src.loc(p), "schema", "a 'for' block needs 'ops'")
                var, vals = self.loop_values(item["for"], env, src.value_loc(p + ("for",)))
                before = len(out)
                bud = current_budget()
                for k, v in enumerate(vals):
                    try:
                        bud.spend(1)  # an empty body still costs its iterations
                    except ExprError as e:
                        raise PlanError.at(src.loc(p), e.code, e.message) from None
                    got = self.flatten(item["ops"], ChainMap({var: v}, env), p + ("ops",), src)
                    if k == 0 and len(got) * len(vals) > MAX_OPS:  # refuse before expanding the rest
                        raise PlanError.at(src.loc(p), "limit", f"this loop expands to {len(got) * len(vals):,} ops"
                                           f" ({len(vals):,} x {len(got):,}); the limit is {MAX_OPS:,} (budget 'ops')")
                    out += got
                    if len(out) + len(self.ops) > MAX_OPS:
                        raise PlanError.at(src.loc(p), "limit", f"plan expands to more than {MAX_OPS:,} ops"
                                           " (budget 'ops')")
                if len(out) == before:  # kept to say why a plan whose ops are all in loops has none
                    self.empty_loops.append((src.value_loc(p + ("for",)), item["for"], vals))
            else:
                out.append(Entry(item, env, p if not keyed else path + (next(iter(item)),), src))
        return out

    def entry_kind(self, e: Entry) -> str:
        it = e.item
        if isinstance(it, dict) and "variants" in it:
            return "region"
        if isinstance(it, dict) and "op" in it:
            return "long"
        if isinstance(it, dict) and len(it) == 1:
            k = next(iter(it))
            if k in RESERVED:
                raise PlanError.at(e.src.loc(e.path), "schema", f"'{k}' cannot be an output name here")
            return "compact"
        if isinstance(it, str):
            raise PlanError.at(e.src.loc(e.path), "schema",
                               f"an op must be 'outputs: call(...)' or a mapping with 'op:'; got the string {it!r}")
        hint = None
        if isinstance(it, dict) and any(isinstance(v, str) and v.count("(") > v.count(")") for v in it.values()):
            hint = "inside {...} a ',' ends the value: quote the call, e.g. {y: 'gemm(x, w)'}"
        raise PlanError.at(e.src.loc(e.path), "schema",
                           "an op must be 'outputs: call(...)', a mapping with 'op:', a 'for' block or a region"
                           " with 'variants'", hint)

    def out_names(self, text, env, loc) -> list[str]:
        text = self.interp(str(text), env, loc)
        names = [n.strip() for n in text.split(",")]
        for n in names:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", n):
                raise PlanError.at(loc, "schema", f"'{n}' is not a valid tensor name")
        return names

    def defined(self, e: Entry) -> list[str]:
        kind = self.entry_kind(e)
        if kind == "compact":
            k = next(iter(e.item))
            return [n for n in self.out_names(k, e.env, e.src.loc(e.path)) if n != "_"]
        if kind == "long":
            outs = e.item.get("out", [])
            if isinstance(outs, str):
                outs = [outs]
            if not isinstance(outs, list):
                raise PlanError.at(e.src.loc(e.path + ("out",)), "schema", "'out' must be a name or a list of names")
            return [self.interp(str(n), e.env, e.src.loc(e.path + ("out",))) for n in outs if n != "_"]
        # region: its exported names
        outs = e.item.get("outputs")
        if outs is None:
            raise PlanError.at(e.src.loc(e.path), "variant", "a region needs 'outputs:' (the names its variants export)")
        if not isinstance(outs, list):
            raise PlanError.at(e.src.loc(e.path + ("outputs",)), "schema", "'outputs' must be a list of names")
        return [self.interp(str(n), e.env, e.src.loc(e.path + ("outputs",))) for n in outs]

    # ------------------------------------------------------------ bodies

    def body(self, entries: list[Entry], scope: Scope, fixed: dict | None = None):
        """Two passes: register every name this body defines, then desugar."""
        fixed = fixed or {}
        for e in entries:
            for n in self.defined(e):
                loc = e.src.loc(e.path)
                if n in scope.names and n not in fixed:
                    raise PlanError.at(loc, "dup", f"tensor '{n}' is defined twice in this scope")
                if n in fixed:
                    if n in scope.exported:
                        raise PlanError.at(loc, "dup", f"tensor '{n}' is defined twice in this scope")
                    scope.exported[n] = fixed[n]
                    scope.names[n] = fixed[n]
                else:
                    scope.names[n] = scope.prefix + n
        for e in entries:
            kind = self.entry_kind(e)
            if kind == "compact":
                self.compact(e, scope)
            elif kind == "long":
                self.long(e, scope)
            else:
                self.region(e, scope)
        missing = [n for n in fixed if n not in scope.exported]
        return missing

    def region(self, e: Entry, scope: Scope, rid: str | None = None, outputs: list | None = None):
        it, src = e.item, e.src
        allowed = {"region", "variants", "outputs", "doc"}
        for k in it:
            if k not in allowed:
                raise PlanError.at(src.loc(e.path + (k,)), "schema", f"unknown key '{k}' in a region",
                                   did_you_mean(k, allowed))
        if "doc" in it and not isinstance(it["doc"], str):
            raise PlanError.at(src.value_loc(e.path + ("doc",)), "schema", "a region's 'doc' must be text")
        if "region" in it and not (isinstance(it["region"], str) and re.fullmatch(r"[\w{}.+\- ]+", it["region"])):
            raise PlanError.at(src.loc(e.path + ("region",)), "schema",
                               f"'region' must be a name (found {it['region']!r:.40})")
        rid = rid or scope.prefix + self.interp(str(it.get("region", f"region{len(self.regions)}")), e.env, src.loc(e.path))
        outputs = outputs if outputs is not None else self.defined(e)
        self.variants(it["variants"], e.env, e.path + ("variants",), src, scope, rid, outputs)

    def variants(self, vlist, env, path, src: Source, scope: Scope, rid: str, outputs: list):
        loc = src.loc(path)
        if not isinstance(vlist, list) or not vlist:
            raise PlanError.at(loc, "variant", "'variants' must be a non-empty list")
        seen, meta = set(), []
        for i, v in enumerate(vlist):
            vp = path + (i,)
            if not isinstance(v, dict):
                raise PlanError.at(src.loc(vp), "variant", "a variant is a mapping with 'name', 'when' and 'ops'")
            for k in v:
                if k not in ("name", "when", "ops", "doc"):
                    raise PlanError.at(src.loc(vp + (k,)), "schema", f"unknown key '{k}' in a variant",
                                       did_you_mean(k, ["name", "when", "ops", "doc"]))
            if "doc" in v and not isinstance(v["doc"], str):
                raise PlanError.at(src.value_loc(vp + ("doc",)), "schema", "a variant's 'doc' must be text")
            name = v.get("name")
            if not isinstance(name, str) or not IDENT.fullmatch(name):
                raise PlanError.at(src.loc(vp), "variant", "every variant needs a 'name' (an identifier)")
            if name in seen:
                raise PlanError.at(src.loc(vp + ("name",)), "dup", f"variant '{name}' is defined twice")
            seen.add(name)
            if "ops" not in v:
                raise PlanError.at(src.loc(vp), "variant", f"variant '{name}' has no 'ops'")
            when = v.get("when")
            if when is not None and not isinstance(when, (str, bool)):
                raise PlanError.at(src.loc(vp + ("when",)), "type", "'when' must be a boolean expression")
            if i < len(vlist) - 1 and when is None:
                raise PlanError.at(src.loc(vp), "variant",
                                   f"variant '{name}' has no 'when' but is not last: only the last variant is the fallback")
            if i == len(vlist) - 1 and when is not None:
                raise PlanError.at(src.loc(vp + ("when",)), "variant",
                                   f"the last variant ('{name}') is the fallback and must not have 'when'",
                                   "add a variant without 'when' at the end")
            if isinstance(when, str):  # {L} of a for-loop names this pass's tensors, as in ops
                when = self.interp(when, env, src.value_loc(vp + ("when",)))
            meta.append((name, None if when is None else str(when).lower() if isinstance(when, bool) else when,
                         src.value_loc(vp + ("when",)), src.loc(vp)))
        if len(vlist) > MAX_VARIANTS:
            raise PlanError.at(loc, "limit", f"region '{rid}' has {len(vlist):,} variants; the limit is {MAX_VARIANTS}"
                               " (budget 'variants')")
        if len(self.regions) >= MAX_REGIONS:
            raise PlanError.at(loc, "limit", f"the plan has more than {MAX_REGIONS:,} regions (budget 'regions')")
        first = self.region_locs.get(rid)
        if first is not None:
            raise PlanError.at(src.loc(path[:-1] + ("region",)) if path else loc, "dup",
                               f"region '{rid}' is defined twice (first at {first})",
                               "name each region once; in a for-loop, with the loop variable (region: moe{L})")
        self.region_locs[rid] = src.loc(path[:-1] + ("region",)) if path else loc
        visible = ScopeView(scope)  # resolved on use: a snapshot per region made many regions quadratic
        self.regions.append(RegionRaw(rid, meta, [scope.resolve(n) if n in scope.names else n for n in outputs], loc,
                                      visible, scope.ctx))
        choices = {n: [] for n in outputs}
        for i, v in enumerate(vlist):
            name = v["name"]
            vs = Scope(f"{rid}/{name}/", {}, scope, scope.ctx + ((rid, name),))
            entries = self.flatten(v["ops"], env, path + (i, "ops"), src)
            local = {n: f"{rid}/{name}/{n}" for n in outputs}
            missing = self.body(entries, vs, fixed=local)
            if missing:
                raise PlanError.at(src.loc(path + (i,)), "variant",
                                   f"variant '{name}' does not define '{missing[0]}', which the region exports")
            for n in outputs:
                choices[n].append(local[n])
        names = [v["name"] for v in vlist]
        for n in outputs:
            actual = scope.names.get(n, scope.prefix + n)
            self.add(RawOp({"op": "select", "id": actual, "out": [actual], "region": rid,
                            "choices": choices[n], "variants": names}, loc, ctx=scope.ctx))

    # ------------------------------------------------------------ single ops

    def add(self, raw: RawOp):
        self.ops.append(raw)
        if len(self.ops) > MAX_OPS:
            where = f" (inlining blocks {' -> '.join(self.block_stack)})" if self.block_stack else ""
            raise PlanError.at(raw.loc, "limit", f"plan expands to more than {MAX_OPS:,} ops{where} (budget 'ops')")

    def long(self, e: Entry, scope: Scope):
        it, src, env = dict(e.item), e.src, e.env
        kind = it.get("op")
        loc = src.loc(e.path)
        if not isinstance(kind, str) or kind not in USER_OPS:
            raise PlanError.at(src.loc(e.path + ("op",)), "schema", f"unknown op '{kind}'",
                               did_you_mean(str(kind), USER_OPS))
        d, flocs = {}, {}
        for k, v in it.items():
            floc = src.loc(e.path + (k,))
            flocs[k] = floc
            if k in ("op", "out"):
                continue
            fk = FIELD_KINDS.get(k)
            d[k] = self.convert_yaml(v, fk, env, scope, src.value_loc(e.path + (k,)))
        outs = it.get("out", [])
        outs = [outs] if isinstance(outs, str) else outs
        outs = [self.interp(str(n), env, flocs.get("out", loc)) for n in outs]
        self.finish(kind, d, outs, scope, loc, flocs)

    def convert_yaml(self, v, fk, env, scope, loc):
        if isinstance(v, str):
            v = self.interp(v, env, loc)
        if fk == T:
            if not isinstance(v, str):
                raise PlanError.at(loc, "schema", "expected a tensor name")
            return scope.resolve(v)
        if fk == TL:
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise PlanError.at(loc, "schema", "expected a list of tensor names")
            return [scope.resolve(self.interp(x, env, loc)) for x in v]
        if fk == INT and isinstance(v, str):
            return self.int_value(v, env, loc)
        if fk == INT and not (isinstance(v, int) and not isinstance(v, bool)):
            raise PlanError.at(loc, "type", f"expected an integer (found {v!r:.40})")
        if fk == DL and isinstance(v, list):
            return [self.interp(x, env, loc) if isinstance(x, str) else x for x in v]
        if fk == IL and isinstance(v, list):  # static integers: literals or expressions of params
            return [self.int_value(self.interp(x, env, loc), env, loc) if isinstance(x, str) else x for x in v]
        return v

    def int_ast(self, v, env, loc, why: str) -> int:
        """An argument's expression evaluated to an integer (why: the error when it is not one)."""
        try:
            r = evaluate(v, env)
        except ExprError as e:
            dims = sorted(free_names(v) & self.dims) if e.code == "name" else []
            if dims:
                raise PlanError.at(loc.shift(e.pos), "type", f"{why}: '{dims[0]}' is a dim, known only at the call;"
                                   " this argument is fixed when the plan is built (a literal or params)") from None
            raise PlanError.at(loc.shift(e.pos), e.code, e.message, e.hint) from None
        if not isinstance(r, int) or isinstance(r, bool):
            raise PlanError.at(loc.shift(v.pos), "type", why)
        return r

    def int_value(self, text: str, env, loc) -> int:
        try:
            ast = parse(text)
        except ExprError as e:
            raise PlanError.at(loc.shift(e.pos), e.code, e.message, e.hint) from None
        return self.int_ast(ast, env, loc, f"'{text}' must be an integer")

    def finish(self, kind, d, outs, scope: Scope, loc: Loc, flocs: dict):
        real = [scope.names.get(n, scope.prefix + n) if n != "_" else "_" for n in outs]
        op_id = d.pop("id", None)
        base = next((n for n in real if n != "_"), None)
        if op_id is not None:
            op_id = scope.prefix + str(op_id)
        else:
            op_id = base or f"{scope.prefix}{kind}{len(self.ops)}"
        real = [n if n != "_" else f"{op_id}._{i}" for i, n in enumerate(real)]
        if not real and kind != "split":
            real = [op_id]
        d.update({"op": kind, "id": op_id, "out": real})
        self.add(RawOp(d, loc, flocs, scope.ctx))

    def compact(self, e: Entry, scope: Scope):
        key, value = next(iter(e.item.items()))
        src, env = e.src, e.env
        kloc = src.loc(e.path)
        outs = self.out_names(key, env, kloc)
        vloc = src.value_loc(e.path + (key,))
        if not isinstance(value, str):
            raise PlanError.at(vloc, "schema", f"'{key}' must map to a call such as 'gemm(x, w)'")
        text, vloc = self.interp_located(value, env, vloc)
        try:
            ast = parse(text)
        except ExprError as ex:
            raise PlanError.at(vloc.shift(ex.pos), ex.code, ex.message, ex.hint) from None
        self.lower_call(ast, outs, scope, vloc, env)

    def lower_call(self, ast, outs: list[str], scope: Scope, loc: Loc, env: dict, anon: str | None = None):
        """Lower one call AST to raw ops; returns the (actual) name of its first output."""
        if isinstance(ast, Index):
            return self.lower_index(ast, outs, scope, loc, env, anon)
        if isinstance(ast, Name):
            raise PlanError.at(loc.shift(ast.pos), "schema",
                               f"'{ast.id}' alone is not an op; write copy({ast.id}) or a call")
        if not isinstance(ast, Call):
            raise PlanError.at(loc.shift(getattr(ast, 'pos', 0)), "schema", f"expected a call, got '{unparse(ast)}'")
        if ast.fn in self.blocks:
            return self.call_block(ast, outs, scope, loc, env)
        if ast.fn not in POSITIONAL:
            raise PlanError.at(loc.shift(ast.pos), "name", f"unknown op or block '{ast.fn}'",
                               did_you_mean(ast.fn, list(POSITIONAL) + list(self.blocks)))
        sig = POSITIONAL[ast.fn]
        kw = {}
        model = OP_MODELS[ast.fn]
        op_outs = outs if anon is None else [anon]
        op_id_hint = anon or next((scope.names.get(n, scope.prefix + n) for n in outs if n != "_"), None)
        for i, a in enumerate(ast.args):
            if sig and sig[-1].startswith("*") and i >= len(sig) - 1:
                kw.setdefault("args", []).append(a)
                continue
            if i >= len(sig):
                raise PlanError.at(loc.shift(a.pos), "schema",
                                   f"{ast.fn} takes at most {len(sig)} positional arguments ({', '.join(sig)})")
            if ast.fn == "cat" and i == 0 and not isinstance(a, ListE):
                # cat(a, b, c, dim=-1): varargs form
                kw["xs"] = list(ast.args)
                break
            kw[sig[i]] = a
        for k, v in ast.kwargs:
            if k in kw:
                raise PlanError.at(loc.shift(v.pos), "schema", f"'{k}' given twice")
            if k not in model.model_fields or k in ("out", "op", "fused_from") or (k == "inplace" and ast.fn == "cat"):
                raise PlanError.at(loc.shift(v.pos), "schema", f"{ast.fn} has no argument '{k}'",
                                   did_you_mean(k, [f for f in model.model_fields if f not in ("out", "op")]))
            kw[k] = v
        d, flocs = {}, {}
        for k, v in kw.items():
            flocs[k] = loc.shift(_start(v) if hasattr(v, "pos") else 0)
            d[k] = self.convert_ast(v, k, scope, loc, env, f"{op_id_hint}.{k}")
        self.finish(ast.fn, d, op_outs, scope if anon is None else _Raw(scope), loc.shift(ast.pos), flocs)
        return self.ops[-1].d["out"][0]

    def lower_index(self, ast: Index, outs, scope, loc, env, anon):
        base = self.tensor_ref(ast.value, scope, loc, env, (anon or scope.prefix + outs[0]) + ".src")
        cur = base
        slices = [(d, it) for d, it in enumerate(ast.items) if not (isinstance(it, Slice) and it.start is None and it.stop is None)]
        if not slices:
            raise PlanError.at(loc.shift(ast.pos), "schema", "a subscript must slice at least one dim")
        for j, (dim, it) in enumerate(slices):
            if not isinstance(it, Slice):
                raise PlanError.at(loc.shift(it.pos), "schema", "integer indexing is not supported; use a slice a:b")
            last = j == len(slices) - 1
            d = {"x": cur, "dim": dim}
            if it.start is not None:
                d["start"] = self.dim_text(it.start)
            if it.stop is not None:
                d["stop"] = self.dim_text(it.stop)
            o = (outs if anon is None else [anon]) if last else [f"{(anon or scope.prefix + outs[0])}.s{dim}"]
            self.finish("slice", d, o, scope if (last and anon is None) else _Raw(scope), loc.shift(_start(ast)), {})
            cur = self.ops[-1].d["out"][0]
        return cur

    def tensor_ref(self, a, scope, loc, env, anon_name):
        if isinstance(a, Name):
            return scope.resolve(a.id)
        if isinstance(a, (Call, Index)):
            return self.lower_call(a, [], scope, loc, env, anon=anon_name)
        raise PlanError.at(loc.shift(a.pos), "schema", f"expected a tensor, got '{unparse(a)}'")

    @staticmethod
    def dim_text(a):
        return a.value if isinstance(a, Num) else unparse(a)

    def convert_ast(self, v, k, scope, loc, env, anon_name):
        fk = FIELD_KINDS.get(k)
        if k == "args" and isinstance(v, list):
            return [self.tensor_ref(x, scope, loc, env, f"{anon_name}{i}") for i, x in enumerate(v)]
        if fk == T:
            return self.tensor_ref(v, scope, loc, env, anon_name)
        if fk == TL:
            items = v.items if isinstance(v, ListE) else v if isinstance(v, list) else None
            if items is None:
                raise PlanError.at(loc.shift(v.pos), "schema", f"'{k}' needs a list of tensors like [a, b]")
            return [self.tensor_ref(x, scope, loc, env, f"{anon_name}{i}") for i, x in enumerate(items)]
        if fk == S:
            if isinstance(v, Name):
                return v.id
            from ..expr import Str
            if isinstance(v, Str):
                return v.value
            if k in ("dtype", "out_dtype"):
                from ..shapes import DTYPES
                raise PlanError.at(loc.shift(v.pos), "type", f"'{k}' must be a dtype name (got {unparse(v)});"
                                   f" valid: {', '.join(DTYPES)}")
            raise PlanError.at(loc.shift(v.pos), "schema", f"'{k}' needs a name, got '{unparse(v)}'")
        if fk == STR:
            from ..expr import Str
            if not isinstance(v, Str):
                raise PlanError.at(loc.shift(v.pos), "schema", f"'{k}' needs a quoted string")
            return v.value
        if fk == INT:
            return self.int_ast(v, env, loc, f"'{k}' must be an integer")
        if fk == F:
            from ..expr import Str
            val = None
            if isinstance(v, Num):
                val = float(v.value)
            elif isinstance(v, Str):  # expressions have no float literals: eps='1e-6'
                try:
                    val = float(v.value)
                except ValueError:
                    pass
            else:  # an integer expression: -5, hidden // 64
                try:
                    r = evaluate(v, env)
                except ExprError:
                    r = None
                if isinstance(r, int) and not isinstance(r, bool):
                    val = float(r)
            if val is None:
                raise PlanError.at(loc.shift(v.pos), "type", f"'{k}' must be a number (quote a fraction: {k}='1e-6')")
            if not math.isfinite(val):
                raise PlanError.at(loc.shift(v.pos), "type", f"'{k}' must be a finite number, got {unparse(v)}")
            return val
        if fk == B:
            if isinstance(v, Name) and v.id in ("true", "false"):
                return v.id == "true"
            raise PlanError.at(loc.shift(v.pos), "type", f"'{k}' must be true or false")
        if fk == SL:
            if isinstance(v, ListE) and all(isinstance(x, Name) for x in v.items):
                return [x.id for x in v.items]
            raise PlanError.at(loc.shift(v.pos), "schema", f"'{k}' needs a list of names like [bf16, fp32]")
        if fk == DLL:
            if isinstance(v, ListE) and all(isinstance(x, ListE) for x in v.items):
                return [[self.dim_text(y) for y in x.items] for x in v.items]
            raise PlanError.at(loc.shift(v.pos), "schema", f"'{k}' needs a list of shapes like [[num_tokens, 8], [4]]")
        if fk == IL:
            if not isinstance(v, ListE):
                raise PlanError.at(loc.shift(v.pos), "schema", f"'{k}' needs a list of integers like [1, 128]")
            return [self.int_ast(x, env, loc, f"'{k}' takes integers or expressions of params, not '{unparse(x)}'")
                    for x in v.items]
        if fk == DL:
            if isinstance(v, ListE):
                return [self.dim_text(x) for x in v.items]
            return self.dim_text(v)
        if fk == D:
            return self.dim_text(v)
        raise PlanError.at(loc.shift(getattr(v, "pos", 0)), "schema", f"unsupported argument '{k}'")

    # ------------------------------------------------------------ blocks

    def call_block(self, ast: Call, outs, scope: Scope, loc: Loc, env: dict):
        name = ast.fn
        doc, src, bpath = self.blocks[name]
        if name in self.block_stack:
            raise PlanError.at(loc.shift(ast.pos), "cycle", f"block '{name}' calls itself (through {' -> '.join(self.block_stack)})")
        if len(self.block_stack) >= MAX_BLOCK_DEPTH:
            raise PlanError.at(loc.shift(ast.pos), "limit", f"blocks are inlined more than {MAX_BLOCK_DEPTH} levels deep"
                               f" ({' -> '.join(self.block_stack[:4])} -> ... -> {name}) (budget 'block-depth')")
        args = doc.get("args", [])
        bouts = doc.get("outputs", [])
        kwargs = dict(ast.kwargs)
        inst = kwargs.pop("id", None)
        if kwargs:
            k = next(iter(kwargs))
            raise PlanError.at(loc.shift(kwargs[k].pos), "schema", f"block '{name}' takes no keyword '{k}' (only id=)")
        if len(ast.args) != len(args):
            raise PlanError.at(loc.shift(ast.pos), "schema",
                               f"block '{name}' takes {len(args)} tensors ({', '.join(args)}), got {len(ast.args)}")
        if len(outs) != len(bouts):
            raise PlanError.at(loc, "schema",
                               f"block '{name}' returns {len(bouts)} tensors ({', '.join(bouts)}), but {len(outs)} names are given")
        if inst is not None:
            inst_id = scope.prefix + (inst.id if isinstance(inst, Name) else str(getattr(inst, "value", inst)))
            here = loc.shift(getattr(inst, "pos", 0))
            first = self.instance_locs.get(inst_id)
            if first is not None:
                raise PlanError.at(here, "dup", f"block call id '{inst_id}' is used twice (first at {first})",
                                   "give each call its own id= (in a for-loop, with the loop variable: id=proj{L})")
            self.instance_locs[inst_id] = here
        else:
            k = self.instances.get(name, 0)
            self.instances[name] = k + 1
            inst_id = f"{scope.prefix}{name}.{k}"
        actual_args = [self.tensor_ref(a, scope, loc, env, f"{inst_id}.arg{i}") for i, a in enumerate(ast.args)]
        bscope = Scope(inst_id + "/", dict(zip(args, actual_args, strict=True)), None, scope.ctx)
        fixed = {}
        for bo, o in zip(bouts, outs, strict=True):
            fixed[bo] = scope.names.get(o, scope.prefix + o) if o != "_" else f"{inst_id}/{bo}"
        self.block_stack.append(name)
        benv = ChainMap({}, self.params)  # a view: copying every param per call made many calls quadratic
        if "variants" in doc:
            bscope.names.update(fixed)
            self.variants(doc["variants"], benv, bpath + ("variants",), src, bscope, inst_id, bouts)
        else:
            entries = self.flatten(doc.get("ops", []), benv, bpath + ("ops",), src)
            missing = self.body(entries, bscope, fixed=fixed)
            if missing:
                raise PlanError.at(src.loc(bpath), "schema", f"block '{name}' does not define its output '{missing[0]}'")
        self.block_stack.pop()
        return fixed[bouts[0]] if bouts else None


def _start(e) -> int:
    """Column of the first character of an expression (Index and Bin positions are their operators)."""
    while isinstance(e, Index) or (hasattr(e, "l") and hasattr(e, "op")):
        e = e.value if isinstance(e, Index) else e.l
    return e.pos


class _Raw(Scope):
    """A scope view used for anonymous intermediates: names are used as given."""

    def __init__(self, inner: Scope):
        super().__init__("", {}, inner, inner.ctx)
