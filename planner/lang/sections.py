"""A plan's declarations: params (values, choices, bounds, --set), dims and their buckets,
groups, tensor declarations, and the names `for` clauses generate. The loader (loader.py)
calls these before it expands the ops; each failure is a PlanError at its place."""

from __future__ import annotations

import re
from collections import ChainMap

from ..errors import Loc, PlanError, did_you_mean
from ..expr import ExprError, evaluate, fold, free_names, parse, unparse
from ..infer import TUNED_IN_DIM
from ..ir import DimSpec
from ..shapes import DTYPE_ALIASES, DTYPES, TensorSpec, unknown_dtype
from .expand import IDENT, MAX_OPS, Expander
from .yamlsrc import Source

__all__ = ["eval_params", "dims_of", "groups_of", "tensor_decl", "expand_keys", "expr_error", "is_int"]

_FOR_WORD = re.compile(r"\s+for\s+(?=[A-Za-z_]\w*\s+in\s)")


def expr_error(e: ExprError, loc: Loc) -> PlanError:
    return PlanError.at(loc.shift(e.pos), e.code, e.message, e.hint)


# ---------------------------------------------------------------- params

MAX_PARAMS = 50_000
_PARAM_KEYS = ["value", "choices", "min", "max", "doc"]


def _among(v, choices) -> bool:
    """v is one of choices, of the same type (1 is not true)."""
    return any(v == c and type(v) is type(c) for c in choices)


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _param_spec(name, raw, src: Source, path) -> dict:
    """The param's mapping form with every field's type checked (value is checked when evaluated)."""
    loc = src.loc(path)
    if not IDENT.fullmatch(name):
        raise PlanError.at(loc, "param", f"'{name}' is not a valid param name")
    spec = raw if isinstance(raw, dict) else {"value": raw}
    bad = set(spec) - set(_PARAM_KEYS)
    if bad:
        k = sorted(bad)[0]
        raise PlanError.at(src.loc(path + (k,)), "schema", f"unknown key '{k}' in param '{name}'",
                           did_you_mean(k, _PARAM_KEYS))
    if "value" not in spec:
        raise PlanError.at(loc, "param", f"param '{name}' needs a value")
    ch = spec.get("choices")
    if "choices" in spec and (not isinstance(ch, list) or not ch or not all(
            isinstance(c, (int, str)) or (isinstance(c, list) and all(is_int(x) for x in c)) for c in ch)):
        raise PlanError.at(src.value_loc(path + ("choices",)), "type",
                           f"'choices' of param '{name}' must be a non-empty list of integers or strings"
                           f" (found {ch!r:.60})")
    for bound in ("min", "max"):
        if bound in spec and not is_int(spec[bound]):
            raise PlanError.at(src.value_loc(path + (bound,)), "type",
                               f"'{bound}' of param '{name}' must be an integer (found {spec[bound]!r:.60})")
    if "doc" in spec and not isinstance(spec["doc"], str):
        raise PlanError.at(src.value_loc(path + ("doc",)), "type", f"'doc' of param '{name}' must be a string")
    return spec


def eval_params(decls: dict, overrides: dict) -> dict:
    """decls: name -> (raw value, Source, path). Evaluated in dependency order (linear in the params)."""
    for k in overrides:
        if k not in decls:
            raise PlanError.at(None, "param", f"--set {k}: the plan has no param '{k}'", did_you_mean(k, decls))
    if len(decls) > MAX_PARAMS:
        _, src, path = list(decls.values())[MAX_PARAMS]
        raise PlanError.at(src.loc(path), "limit", f"the plan has {len(decls):,} params; the limit is {MAX_PARAMS:,}"
                           " (budget 'params')")
    exprs, values, meta = {}, {}, {}
    for name, (raw, src, path) in decls.items():
        spec = _param_spec(name, raw, src, path)
        meta[name] = (spec, src, path)
        v = overrides.get(name, spec["value"])
        vpath = path + ("value",) if isinstance(raw, dict) else path
        # an unquoted string that is one of the string choices (and names no param) is that string,
        # as it is in the choices: `{value: fast, choices: [fast, slow]}`
        strs = [c for c in spec.get("choices") or () if isinstance(c, str)]
        if isinstance(v, str) and name not in overrides and not (v in strs and v not in decls):
            if strs and IDENT.fullmatch(v) and v not in decls and v not in DTYPES and v not in DTYPE_ALIASES:
                raise PlanError.at(src.value_loc(vpath), "param", f"param '{name}' = {v!r:.60} (value) is not one"
                                   f" of {spec['choices']!r:.200}", did_you_mean(v, strs))
            try:
                exprs[name] = (parse(v), src.value_loc(vpath))
            except ExprError as e:
                raise expr_error(e, src.value_loc(vpath)) from None
        elif isinstance(v, (bool, int, str)) or (isinstance(v, list) and all(is_int(x) for x in v)):
            if is_int(v) and not -2**63 <= v <= 2**63:
                raise PlanError.at(src.value_loc(vpath), "param", f"param '{name}' = {v} is beyond +-2**63")
            values[name] = v
        else:
            raise PlanError.at(src.value_loc(vpath), "type", f"param '{name}' must be an integer, string, list of"
                               f" integers or expression (found {v!r:.60})")
    for name in overrides:  # an overridden value against its choices first: params derived from it fail later
        spec, src, path = meta[name]
        if "choices" in spec and not _among(values.get(name, spec["choices"][0]), spec["choices"]):
            raise PlanError.at(src.loc(path), "param", f"param '{name}' = {values[name]!r:.60} (--set) is not one of"
                               f" {spec['choices']!r:.200}")
    # dependency order (Kahn): each param is evaluated once all the params it names are known
    env = {**DTYPE_ALIASES, **{k: k for k in DTYPES}, **values}
    waiting: dict[str, int] = {}
    users: dict[str, list[str]] = {}
    ready = []
    for name, (ast, loc) in exprs.items():
        deps = free_names(ast) - {"true", "false"}
        unknown = sorted(d for d in deps if d not in decls and d not in DTYPES and d not in DTYPE_ALIASES)
        if unknown:
            raise PlanError.at(loc, "name", f"param '{name}' uses unknown name '{unknown[0]}'",
                               did_you_mean(unknown[0], decls))
        todo = [d for d in deps if d in exprs]
        waiting[name] = len(todo)
        for d in todo:
            users.setdefault(d, []).append(name)
        if not todo:
            ready.append(name)
    while ready:
        name = ready.pop()
        ast, loc = exprs[name]
        try:
            env[name] = evaluate(ast, env)
        except ExprError as e:
            raise PlanError.at(loc.shift(e.pos), e.code, f"param '{name}': {e.message}", e.hint) from None
        for u in users.get(name, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    if any(waiting.values()):
        names = sorted(n for n, w in waiting.items() if w)
        raise PlanError.at(exprs[names[0]][1], "cycle", f"params depend on each other in a cycle: {', '.join(names[:8])}"
                           + (f" (and {len(names) - 8} more)" if len(names) > 8 else ""))
    params = {k: env[k] for k in decls}
    for name, (spec, src, path) in meta.items():
        v = params[name]
        if "choices" in spec and not _among(v, spec["choices"]):
            where = "--set" if name in overrides else "value"
            raise PlanError.at(src.loc(path), "param", f"param '{name}' = {v!r:.60} ({where}) is not one of"
                               f" {spec['choices']!r:.200}")
        for bound, ok in (("min", lambda a, b: a >= b), ("max", lambda a, b: a <= b)):
            if bound not in spec:
                continue
            if not is_int(v):
                raise PlanError.at(src.loc(path), "type", f"param '{name}' has '{bound}' but its value {v!r:.60}"
                                   " is not an integer")
            if not ok(v, spec[bound]):
                raise PlanError.at(src.loc(path), "param", f"param '{name}' = {v} violates {bound} {spec[bound]}")
    return params


# ---------------------------------------------------------------- dims, groups, tensors

def dims_of(decls: dict, params: dict) -> dict[str, DimSpec]:
    out = {}
    for name, (raw, src, path) in decls.items():
        if name in params:
            raise PlanError.at(src.loc(path), "dup", f"'{name}' is both a param and a dim")
        spec = raw if isinstance(raw, dict) else {"range": raw}
        bad = set(spec) - {"range", "buckets", "doc"}
        if bad:
            raise PlanError.at(src.loc(path), "schema", f"unknown key '{sorted(bad)[0]}' in dim '{name}'")
        if "doc" in spec and not isinstance(spec["doc"], str):
            raise PlanError.at(src.loc(path + ("doc",)), "type", f"'doc' of dim '{name}' must be a string")
        rng = spec.get("range")
        loc = src.value_loc(path + (("range",) if isinstance(raw, dict) else ()))
        if not isinstance(rng, str) or ".." not in rng:
            raise PlanError.at(loc, "schema", f"dim '{name}' needs a range 'LO..HI', e.g. 1..8192")
        lo_s, hi_s = rng.split("..", 1)
        vals = []
        for off, part in ((0, lo_s), (len(lo_s) + 2, hi_s)):
            try:
                v = evaluate(parse(part), params)
            except ExprError as e:
                raise expr_error(e, loc.shift(off)) from None
            if not isinstance(v, int) or isinstance(v, bool):
                raise PlanError.at(loc.shift(off), "type", f"dim '{name}' bounds must be integers")
            vals.append(v)
        lo, hi = vals
        if not 0 <= lo <= hi:
            raise PlanError.at(loc, "param", f"dim '{name}' range {lo}..{hi} is empty or negative")
        buckets = spec.get("buckets")
        if isinstance(buckets, str):  # a quoted list expression, as params may be written
            try:
                buckets = evaluate(parse(buckets), params)
            except ExprError as e:
                raise expr_error(e, src.value_loc(path + ("buckets",))) from None
        if buckets is None:
            buckets, b = [], 1
            while b < hi:
                if b >= lo:
                    buckets.append(b)
                b *= 2
            buckets.append(hi)
        elif not isinstance(buckets, list) or not buckets:
            raise PlanError.at(src.loc(path + ("buckets",)), "param",
                               f"buckets of '{name}' must be a non-empty list of sizes in {lo}..{hi}"
                               " (a YAML list such as [1, 8, 64], or a quoted list expression)")
        else:
            buckets = _bucket_values(name, buckets, lo, hi, params, src, path + ("buckets",))
        if max(buckets) != hi:
            # a bucket serves the sizes above the bucket below it: sizes past the largest would be
            # served by none (never rated, never captured). Buckets are a set (sorted, repeats
            # dropped): expressions over params may order or coincide differently per --set
            raise PlanError.at(src.loc(path + ("buckets",)), "param",
                               f"buckets of '{name}' must include its maximum {hi} (the largest is {max(buckets)}:"
                               f" sizes {max(buckets) + 1}..{hi} would have no bucket)",
                               f"add {hi} to the buckets, or end the range at {max(buckets)}")
        out[name] = DimSpec(name, lo, hi, sorted(set(buckets)))
    return out


def _bucket_values(name, items, lo, hi, params, src, path) -> list[int]:
    """A dim's explicit buckets: integers, or expressions over params (2 * tp_size), each in lo..hi."""
    out = []
    for i, b in enumerate(items):
        loc = src.value_loc(path + (i,))
        if isinstance(b, str):
            try:
                b = evaluate(parse(b), params)
            except ExprError as e:
                raise expr_error(e, loc) from None
        if not is_int(b):
            shown = str(b).lower() if isinstance(b, bool) else repr(items[i])
            raise PlanError.at(loc, "type", f"bucket {shown} of '{name}' is not an integer"
                               + (f" (it is {b!r})" if b is not items[i] else "")
                               + "; buckets are sizes, or expressions over params such as 2 * tp_size")
        if not lo <= b <= hi:
            raise PlanError.at(loc, "param", f"bucket {items[i]!r} of '{name}'"
                               + (f" (= {b})" if b is not items[i] else "") + f" is outside its range {lo}..{hi}")
        out.append(b)
    return out


def groups_of(decls: dict, params: dict) -> dict[str, int]:
    out = {}
    for name, (raw, src, path) in decls.items():
        v = raw.get("size") if isinstance(raw, dict) else raw
        loc = src.value_loc(path + (("size",) if isinstance(raw, dict) else ()))
        if isinstance(v, str):
            try:
                v = evaluate(parse(v), params)
            except ExprError as e:
                raise expr_error(e, loc) from None
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise PlanError.at(loc, "param", f"group '{name}' needs a positive integer size")
        out[name] = v
    return out


def group_params_of(decls: dict, params: dict) -> dict[str, list[str]]:
    """group -> the params its size is written with (tp: tp_size -> ['tp_size'])."""
    out = {}
    for name, (raw, _, _) in decls.items():
        v = raw.get("size") if isinstance(raw, dict) else raw
        names = []
        if isinstance(v, str):
            try:
                names = sorted(n for n in free_names(parse(v)) if n in params)
            except ExprError:
                pass  # groups_of has refused it
        out[name] = names
    return out


def tensor_decl(name, raw, kind, src: Source, path, params, dims, probes) -> TensorSpec:
    loc = src.loc(path)
    if isinstance(raw, str):
        # bf16[d0, d1] contiguous   (or, quoted, "[d0, d1] bf16 contiguous")
        m = re.match(r"^\s*([A-Za-z]\w*)\s*(\[.*\])\s*(.*)$", raw, re.S)
        if m:
            shape_text, words = m.group(2), [m.group(1)] + m.group(3).split()
        else:
            m = re.match(r"^\s*(\[.*\])\s*(.*)$", raw, re.S)
            if not m:
                raise PlanError.at(src.value_loc(path), "schema", f"tensor '{name}' must look like 'bf16[d0, d1]'")
            shape_text, words = m.group(1), m.group(2).split()
        spec = {"shape": shape_text, "dtype": words[0] if words else None}
        for w in words[1:]:
            if w != "contiguous":
                raise PlanError.at(src.value_loc(path).shift(raw.find(w)), "schema", f"unknown tensor attribute '{w}'",
                                   did_you_mean(w, ["contiguous"]))
            spec["contiguous"] = True
        vloc = src.value_loc(path)
    elif isinstance(raw, dict):
        spec = dict(raw)
        bad = set(spec) - {"shape", "dtype", "contiguous", "doc"}
        if bad:
            k = sorted(bad)[0]
            raise PlanError.at(src.loc(path + (k,)), "schema", f"unknown key '{k}' in tensor '{name}'",
                               did_you_mean(k, ["shape", "dtype", "contiguous", "doc"]))
        vloc = src.value_loc(path + ("shape",))
    else:
        raise PlanError.at(loc, "schema", f"tensor '{name}' must be '[d0, d1] dtype' or a mapping with shape and dtype")
    dtype = spec.get("dtype")
    if not isinstance(dtype, str):
        raise PlanError.at(loc, "type", f"tensor '{name}' needs a dtype name such as bf16 (found {dtype!r:.40})")
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    if not isinstance(spec.get("contiguous", True), bool):
        raise PlanError.at(src.loc(path + ("contiguous",)), "type", f"'contiguous' of tensor '{name}' must be"
                           f" true or false (found {spec['contiguous']!r:.40})")
    if "doc" in spec and not isinstance(spec["doc"], str):
        raise PlanError.at(src.loc(path + ("doc",)), "type", f"'doc' of tensor '{name}' must be a string")
    if dtype not in DTYPES:
        msg, hint = unknown_dtype(dtype)
        raise PlanError.at(loc, "type", f"tensor '{name}': {msg}", hint or None)
    shape = spec.get("shape")
    if not isinstance(shape, (str, list)):
        raise PlanError.at(vloc, "schema", f"shape of '{name}' must be a list like [num_tokens, hidden]"
                           f" (found {shape!r:.40})")
    try:
        items = parse(shape).items if isinstance(shape, str) else [parse(str(x)) for x in shape]
    except (ExprError, AttributeError, TypeError) as e:
        if isinstance(e, ExprError):
            raise expr_error(e, vloc) from None
        raise PlanError.at(vloc, "schema", f"shape of '{name}' must be a list like [num_tokens, hidden]") from None
    dims_out = []
    for it in items:
        try:
            d = fold(it, params)
        except ExprError as e:
            raise expr_error(e, vloc) from None
        for n in free_names(d) if not isinstance(d, int) else ():
            if n not in dims:
                raise PlanError.at(vloc.shift(it.pos), "name", f"unknown name '{n}' in the shape of '{name}'"
                                   + TUNED_IN_DIM * n.startswith("tuned."), did_you_mean(n, list(params) + list(dims)))
        try:
            negative = any(v < 0 for v in probes.values(d))
        except ExprError as e:  # 1 / 2 at one of the sizes, a division by zero, an overflow
            raise PlanError.at(vloc.shift(it.pos), e.code, f"dim '{unparse(it)}' of '{name}': {e.message}",
                               e.hint) from None
        if negative:
            raise PlanError.at(vloc.shift(it.pos), "shape", f"dim '{unparse(it)}' of '{name}' can be negative")
        dims_out.append(d)
    # meta["contiguous"]: declared (the executor then checks it at the call); unset, contiguity is
    # assumed for planning but not required of a caller's tensor
    meta = {"contiguous": True} if spec.get("contiguous") else {}
    return TensorSpec(name, tuple(dims_out), dtype, kind=kind, contiguous=bool(spec.get("contiguous", True)),
                      meta=meta)


def _for_clauses(key: str) -> tuple[str, list[tuple[int, str]]]:
    """'x{i}_{j} for i in A for j in B' -> ('x{i}_{j}', [(offset, 'i in A'), (offset, 'j in B')]): the
    clauses outside brackets, so a comprehension inside A keeps its own 'for'."""
    cuts, depth, i = [], 0, 0
    while i < len(key):
        c = key[i]
        depth += c in "([{"
        depth -= c in ")]}"
        m = _FOR_WORD.match(key, i) if depth == 0 and c.isspace() else None
        if m:
            cuts.append((m.start(), m.end()))
            i = m.end()
            continue
        i += 1
    if not cuts:
        return key, []
    ends = [s for s, _ in cuts[1:]] + [len(key)]
    return key[:cuts[0][0]], [(e, key[e:end].rstrip()) for (_, e), end in zip(cuts, ends, strict=True)]


def expand_keys(section: dict, src: Source, base: tuple, params: dict, expander: Expander):
    """`aux{i} for i in aux_layers: ...` keys -> one entry per value; several clauses nest, the
    first outermost, and a later clause may use the earlier variables (x{i}_{j} for i in A for j in B)."""
    for key, raw in section.items():
        path = base + (key,)
        pattern, clauses = _for_clauses(key)
        if not clauses:
            yield expander.interp(key, params, src.loc(path)), raw, path
            continue
        envs = [ChainMap({}, params)]
        for off, clause in clauses:
            nxt = []
            for env in envs:
                var, vals = expander.loop_values(clause, env, src.loc(path).shift(off))
                if any(var in m for m in env.maps[:-1]):
                    raise PlanError.at(src.loc(path).shift(off), "dup", f"loop variable '{var}' is used twice in '{key}'")
                nxt += [env.new_child({var: v}) for v in vals]
                if len(nxt) > MAX_OPS:
                    raise PlanError.at(src.loc(path), "limit", f"'{key}' declares more than {MAX_OPS:,} names"
                                       " (budget 'ops')")
            envs = nxt
        for env in envs:
            yield expander.interp(pattern, env, src.loc(path)), raw, path
