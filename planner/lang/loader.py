"""Load a plan file into a validated Plan: params, dims, tensors, ops with shapes.

load_plan() is the single entry point. Every failure is a PlanError with a
location; nothing from the plan is executed.
"""

from __future__ import annotations

import re
from collections import ChainMap
from pathlib import Path

from pydantic import ValidationError

from ..config import MAX_STREAMS
from ..errors import Diagnostic, Loc, PlanError, did_you_mean
from ..expr import ExprError, budget, evaluate, fold, free_names, parse, unparse
from ..infer import TUNED_IN_DIM, check_inplace, infer_all
from ..ir import DimSpec, Plan, Region, Variant
from ..ops import COLLECTIVES, OP_MODELS
from ..predicates import (
    RANK_VARYING,
    GateSchema,
    check_gate,
    check_gate_values,
    rename_tensors,
    simplify_gate,
)
from ..shapes import DTYPE_ALIASES, DTYPES, Probes, TensorSpec, fmt_dim, unknown_dtype
from .document import TYPE_WORDS, load_tree
from .expand import FOR_CLAUSE, IDENT, MAX_OPS, Expander
from .yamlsrc import Source

__all__ = ["load_plan", "parse_overrides"]

_POOL = re.compile(r"^(main|aux([1-9]\d*)?)$")  # the planner's pool names, usable without a 'streams:' list
_FOR_WORD = re.compile(r"\s+for\s+(?=[A-Za-z_]\w*\s+in\s)")


def parse_overrides(items: list[str] | None) -> dict:
    """--set k=v pairs -> {k: int|bool|list[int]|str}: an integer, true / false, a list of
    integers like [1, 2, 4], else the text."""
    out = {}
    for it in items or []:
        if "=" not in it:
            raise PlanError.at(None, "param", f"--set expects NAME=VALUE, got '{it}'")
        k, v = it.split("=", 1)
        k, v = k.strip(), v.strip()
        if v.startswith("[") and v.endswith("]"):
            try:
                items = v[1:-1].split(",") if v[1:-1].strip() else []
                out[k] = [int(x) for x in items]  # an empty item ([1,,2]) is not an integer
            except ValueError:
                raise PlanError.at(None, "param",
                                   f"--set {k}={v}: a list value takes integers, like [1, 2, 4]") from None
            continue
        if v in ("true", "false"):
            out[k] = v == "true"
            continue
        try:
            out[k] = int(v)
        except ValueError:
            out[k] = v
    return out


def _expr_error(e: ExprError, loc: Loc) -> PlanError:
    return PlanError.at(loc.shift(e.pos), e.code, e.message, e.hint)


# ---------------------------------------------------------------- params

MAX_PARAMS = 50_000
_PARAM_KEYS = ["value", "choices", "min", "max", "doc"]


def _among(v, choices) -> bool:
    """v is one of choices, of the same type (1 is not true)."""
    return any(v == c and type(v) is type(c) for c in choices)


def _is_int(v) -> bool:
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
            isinstance(c, (int, str)) or (isinstance(c, list) and all(_is_int(x) for x in c)) for c in ch)):
        raise PlanError.at(src.value_loc(path + ("choices",)), "type",
                           f"'choices' of param '{name}' must be a non-empty list of integers or strings"
                           f" (found {ch!r:.60})")
    for bound in ("min", "max"):
        if bound in spec and not _is_int(spec[bound]):
            raise PlanError.at(src.value_loc(path + (bound,)), "type",
                               f"'{bound}' of param '{name}' must be an integer (found {spec[bound]!r:.60})")
    if "doc" in spec and not isinstance(spec["doc"], str):
        raise PlanError.at(src.value_loc(path + ("doc",)), "type", f"'doc' of param '{name}' must be a string")
    return spec


def _eval_params(decls: dict, overrides: dict) -> dict:
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
                raise _expr_error(e, src.value_loc(vpath)) from None
        elif isinstance(v, (bool, int, str)) or (isinstance(v, list) and all(_is_int(x) for x in v)):
            if _is_int(v) and not -2**63 <= v <= 2**63:
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
            if not _is_int(v):
                raise PlanError.at(src.loc(path), "type", f"param '{name}' has '{bound}' but its value {v!r:.60}"
                                   " is not an integer")
            if not ok(v, spec[bound]):
                raise PlanError.at(src.loc(path), "param", f"param '{name}' = {v} violates {bound} {spec[bound]}")
    return params


# ---------------------------------------------------------------- dims, groups, tensors

def _dims(decls: dict, params: dict) -> dict[str, DimSpec]:
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
                raise _expr_error(e, loc.shift(off)) from None
            if not isinstance(v, int) or isinstance(v, bool):
                raise PlanError.at(loc.shift(off), "type", f"dim '{name}' bounds must be integers")
            vals.append(v)
        lo, hi = vals
        if not 0 <= lo <= hi:
            raise PlanError.at(loc, "param", f"dim '{name}' range {lo}..{hi} is empty or negative")
        buckets = spec.get("buckets")
        if buckets is None:
            buckets, b = [], 1
            while b < hi:
                if b >= lo:
                    buckets.append(b)
                b *= 2
            buckets.append(hi)
        elif not isinstance(buckets, list) or not buckets:
            raise PlanError.at(src.loc(path + ("buckets",)), "param",
                               f"buckets of '{name}' must be a non-empty list of sizes in {lo}..{hi}")
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
                raise _expr_error(e, loc) from None
        if not _is_int(b):
            shown = str(b).lower() if isinstance(b, bool) else repr(items[i])
            raise PlanError.at(loc, "type", f"bucket {shown} of '{name}' is not an integer"
                               + (f" (it is {b!r})" if b is not items[i] else "")
                               + "; buckets are sizes, or expressions over params such as 2 * tp_size")
        if not lo <= b <= hi:
            raise PlanError.at(loc, "param", f"bucket {items[i]!r} of '{name}'"
                               + (f" (= {b})" if b is not items[i] else "") + f" is outside its range {lo}..{hi}")
        out.append(b)
    return out


def _groups(decls: dict, params: dict) -> dict[str, int]:
    out = {}
    for name, (raw, src, path) in decls.items():
        v = raw.get("size") if isinstance(raw, dict) else raw
        loc = src.value_loc(path + (("size",) if isinstance(raw, dict) else ()))
        if isinstance(v, str):
            try:
                v = evaluate(parse(v), params)
            except ExprError as e:
                raise _expr_error(e, loc) from None
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise PlanError.at(loc, "param", f"group '{name}' needs a positive integer size")
        out[name] = v
    return out


def _tensor_decl(name, raw, kind, src: Source, path, params, dims, probes) -> TensorSpec:
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
            raise _expr_error(e, vloc) from None
        raise PlanError.at(vloc, "schema", f"shape of '{name}' must be a list like [num_tokens, hidden]") from None
    dims_out = []
    for it in items:
        try:
            d = fold(it, params)
        except ExprError as e:
            raise _expr_error(e, vloc) from None
        for n in free_names(d) if not isinstance(d, int) else ():
            if n not in dims:
                raise PlanError.at(vloc.shift(it.pos), "name", f"unknown name '{n}' in the shape of '{name}'"
                                   + TUNED_IN_DIM * n.startswith("tuned."), did_you_mean(n, list(params) + list(dims)))
        if any(v < 0 for v in probes.values(d)):
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


def _expand_keys(section: dict, src: Source, base: tuple, params: dict, expander: Expander):
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


# ---------------------------------------------------------------- main

def load_plan(path: str | Path, overrides: dict | None = None, text: str | None = None) -> Plan:
    """Load, expand and check a plan file (or `text` as if it were that file)."""
    from ..errors import no_gc
    with no_gc(), budget():  # one evaluation-step budget for the whole load
        try:
            return _load_plan(path, overrides or {}, text)
        except RecursionError:  # last guards: every recursive walk and evaluation is bounded before these
            raise PlanError.at(Loc(str(path)), "limit", "the plan nests too deeply to check") from None
        except ExprError as e:
            raise PlanError.at(Loc(str(path)), e.code, e.message, e.hint) from None


def _load_plan(path, overrides: dict, text: str | None) -> Plan:
    tree = load_tree(Path(path), text)
    root_src, root = tree[-1]
    if not root.plan:
        raise PlanError.at(root_src.loc(()), "schema", "'plan' (the plan's name) is required in a top-level plan file")

    def merged(section: str) -> dict:
        out: dict = {}
        for src, doc in tree:
            for k, v in getattr(doc, section).items():
                if k in out and out[k][1] is not root_src and src is not root_src:
                    raise PlanError.at(src.loc((section, k)), "dup",
                                       f"{section[:-1]} '{k}' is defined in {out[k][1].file} and {src.file}")
                out[k] = (v, src, (section, k))
        return out

    params = _eval_params(merged("params"), overrides)
    dims = _dims(merged("dims"), params)
    groups = _groups(merged("groups"), params)
    tuned = {k: v for k, (v, _, _) in merged("tuned").items()}
    probes = Probes({k: (d.lo, d.hi) for k, d in dims.items()})
    blocks = {}
    for src, doc in tree:
        for k, b in doc.blocks.items():
            if k in blocks:
                raise PlanError.at(src.loc(("blocks", k)), "dup", f"block '{k}' is defined twice")
            raw = src.data["blocks"][k]
            if (b.ops is None) == (b.variants is None):
                raise PlanError.at(src.loc(("blocks", k)), "schema", f"block '{k}' needs exactly one of 'ops' or 'variants'")
            for field in ("args", "outputs"):
                names = getattr(b, field)
                dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
                if dup is not None:
                    raise PlanError.at(src.loc(("blocks", k, field, names.index(dup, names.index(dup) + 1))), "dup",
                                       f"block '{k}': {field[:-1]} '{dup}' is listed twice")
            blocks[k] = (raw, src, ("blocks", k))
    ex = Expander(params, blocks, dims=dims)

    tensors: dict[str, TensorSpec] = {}
    locs: dict[str, Loc] = {}
    inputs, weights = [], []
    for section, kind, lst in (("inputs", "input", inputs), ("weights", "weight", weights)):
        for name, raw, p in _expand_keys(getattr(root, section), root_src, (section,), params, ex):
            if not IDENT.fullmatch(name):
                raise PlanError.at(root_src.loc(p), "schema", f"'{name}' is not a valid tensor name"
                                   " (ASCII letters, digits and _, not starting with a digit)")
            if name in tensors:
                raise PlanError.at(root_src.loc(p), "dup", f"tensor '{name}' is declared twice")
            tensors[name] = _tensor_decl(name, raw, kind, root_src, p, params, dims, probes)
            dyn = [d for d in tensors[name].shape if not isinstance(d, int)]
            if kind == "weight" and dyn:
                raise PlanError.at(root_src.loc(p), "shape", f"weight '{name}' has a dimension that varies per"
                                   f" call ({fmt_dim(dyn[0])}); weights are bound once at build, so their"
                                   " shapes take params only (declare it under inputs if it changes per call)")
            locs[name] = root_src.loc(p)
            lst.append(name)

    from .expand import Scope
    top = Scope("", {n: n for n in tensors}, None)
    outputs = _outputs(root, root_src, params, ex)
    entries = ex.flatten(root.ops, params, ("ops",), root_src) if root.ops is not None else []
    if root.variants is not None:
        _no_outputs_in_ops(entries, outputs, ex)
        entries.append(_region_entry(root, root_src, params, outputs))
    if not entries:
        raise _nothing_to_run(root, root_src, params, ex)
    ex.body(entries, top)
    # a plan that returns nothing runs only model code kept for its effects; without any, nothing
    if not outputs and not any(r.d.get("op") == "extern" and r.d.get("effects") is True for r in ex.ops):
        where = root_src.loc(("outputs",)) if "outputs" in root.model_fields_set else root_src.loc(())
        raise PlanError.at(where, "schema", "a plan needs at least one output (or model code run for its"
                           " effects: extern(..., effects=true))", "list what the plan returns: outputs: [y]")

    declared = _streams(root, root_src)
    ops = []
    op_ctx = {}
    seen_ids = {}
    for raw in ex.ops:
        try:
            model = OP_MODELS[raw.d["op"]].model_validate(raw.d)  # the expander checked the kind
        except ValidationError as exc:
            raise _op_field_error(raw, exc) from None
        if model.stream is not None and not IDENT.fullmatch(model.stream):
            raise PlanError.at(raw.field_locs.get("stream", raw.loc), "stream",
                               f"stream name {model.stream!r} is not an identifier (e.g. main, aux, comm)")
        if model.stream is not None and model.stream not in declared and not (
                root.streams is None and _POOL.match(model.stream)):
            known = declared if root.streams is not None else ["main", "aux", "aux1", "aux2", "..."]
            raise PlanError.at(raw.field_locs.get("stream", raw.loc), "stream",
                               f"stream '{model.stream}' is not declared (streams: {', '.join(known)})",
                               "declare it in the plan's 'streams:' list" if root.streams is not None
                               else "add 'streams: [main, ...]' to the plan to use other names")
        if root.streams is None and model.stream and model.stream[3:].isdigit() and int(model.stream[3:]) >= MAX_STREAMS:
            raise PlanError.at(raw.field_locs.get("stream", raw.loc), "stream",
                               f"stream '{model.stream}' is beyond the pool: a plan may use {MAX_STREAMS} streams"
                               f" (main, aux1..aux{MAX_STREAMS - 1})")
        if model.id in seen_ids:
            raise PlanError.at(raw.loc, "dup", f"op id '{model.id}' is used twice (first at {seen_ids[model.id]})")
        seen_ids[model.id] = raw.loc
        ops.append(model)
        op_ctx[model.id] = raw.ctx
        locs[model.id] = raw.loc
    field_locs = {raw.d["id"]: raw.field_locs for raw in ex.ops}
    infer_all(ops, tensors, params, dims, groups, probes, locs, field_locs)

    for i, o in enumerate(outputs):
        if o not in tensors:
            raise PlanError.at(root_src.loc(("outputs", i)), "name", f"output '{o}' is never produced",
                               did_you_mean(o, tensors))
    check_inplace(ops, tensors, outputs, locs, field_locs)
    regions = _regions(ex, params, dims, tuned, tensors, ops, op_ctx)
    return Plan(
        name=root.plan, file=root_src.file, params=params, dims=dims, groups=groups, tuned=tuned,
        tensors=tensors, inputs=inputs, weights=weights, outputs=outputs, ops=ops, regions=regions,
        op_ctx=op_ctx, locs=locs, doc=root.doc, streams=root.streams and declared, includes=[s.file for s, _ in tree[:-1]],
    )


_DTYPE_FIELDS = ("dtype", "out_dtype", "dtypes")


def _shown(v) -> str:
    """A YAML value as the plan wrote it (true, not True)."""
    return str(v).lower() if isinstance(v, bool) or v is None else f"{v!r:.40}"


def _op_field_error(raw, exc: ValidationError) -> PlanError:
    """An op's field the model refuses, in the plan's words ('dtype' must be a string (got 3)),
    at the field: a dtype field lists the dtypes."""
    e = exc.errors()[0]
    field = str(e["loc"][0]) if e["loc"] else "op"
    loc = raw.field_locs.get(field, raw.loc)
    got = f" (got {_shown(e['input'])})" if "input" in e and e["type"] not in ("missing", "extra_forbidden") else ""
    if field in _DTYPE_FIELDS and got:
        return PlanError.at(loc, "type", f"{raw.d.get('op')}: '{field}' must be a dtype name{got}; valid: "
                            + ", ".join(DTYPES))
    if e["type"] == "extra_forbidden":
        word = "is not a field of this op"
    elif e["type"] == "literal_error":
        word = e["msg"].replace("Input should be", "must be")
    else:
        word = TYPE_WORDS.get(e["type"], e["msg"][:1].lower() + e["msg"][1:])
    return PlanError.at(loc, "schema", f"{raw.d.get('op')}: '{field}' {word}{got}")


class _Union:
    """Names of `a` or `b` (membership without building the union; iteration only for a hint)."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __contains__(self, n) -> bool:
        return n in self.a or n in self.b

    def __iter__(self):
        return iter(set(self.a) | set(self.b))


def _streams(root, src) -> list[str]:
    """The declared streams (main first), or main + the planner's pool names when none are declared."""
    if root.streams is None:
        return ["main"]
    out = []
    for i, name in enumerate(root.streams):
        loc = src.loc(("streams", i))
        if not IDENT.fullmatch(name):
            raise PlanError.at(loc, "stream", f"stream name {name!r} is not an identifier (e.g. main, aux, comm)")
        if name in out:
            raise PlanError.at(loc, "dup", f"stream '{name}' is declared twice")
        if len(out) == MAX_STREAMS:
            raise PlanError.at(loc, "stream", f"a plan may declare {MAX_STREAMS} streams at most (main included)")
        out.append(name)
    if not out or out[0] != "main":
        raise PlanError.at(src.loc(("streams",)), "stream", "'streams' must list main (the caller's stream) first")
    return out


def _outputs(root, src, params, ex) -> list[str]:
    """The plan's output names, expanded; each listed once (a repeat would be returned, and
    counted, twice)."""
    outputs, first = [], {}
    for i, o in enumerate(root.outputs):
        for n, _, _ in _expand_keys({o: None}, src, ("outputs", i), params, ex):
            if n in first:
                raise PlanError.at(src.loc(("outputs", i)), "dup", f"output '{n}' is listed twice"
                                   f" (first at {first[n].line}:{first[n].col})")
            first[n] = src.loc(("outputs", i))
            outputs.append(n)
    return outputs


def _no_outputs_in_ops(entries, outputs, ex) -> None:
    """With top-level 'variants', the variants make every plan output; top-level ops beside them
    may make only what the variants read."""
    for e in entries:
        made = [n for n in ex.defined(e) if n in outputs]
        if made:
            raise PlanError.at(e.src.loc(e.path), "variant", f"'{made[0]}' is one of the plan's outputs, which its"
                               " top-level 'variants' make (each variant makes every output); top-level 'ops' beside"
                               " 'variants' may only make tensors the variants read",
                               f"to gate only part of the plan, put a region in 'ops' ('- region: NAME' with"
                               f" 'outputs' and 'variants') and make '{made[0]}' from its outputs")


def _nothing_to_run(root, src, params, ex) -> PlanError:
    """Why a plan has no op: no 'ops' at all, or ops whose 'for' loops expand to nothing."""
    if root.ops is None:
        return PlanError.at(src.loc(()), "schema", "the plan has no 'ops' and no 'variants'")
    if not ex.empty_loops:
        return PlanError.at(src.loc(("ops",)), "schema", "the plan's 'ops' list is empty")
    # a loop over no values is the cause (an inner one is recorded before the outer loop around it);
    # else a loop whose body makes nothing
    loc, clause, vals = next((x for x in ex.empty_loops if not x[2]), ex.empty_loops[0])
    m = FOR_CLAUSE.match(clause)
    used = sorted(n for n in free_names(parse(m.group(2))) if n in params) if m else []
    given = f" ({', '.join(f'{n} = {params[n]!r:.60}' for n in used)})" if used else ""
    why = f"runs over {vals!r:.80}" if not vals else f"runs over {vals!r:.80} but its 'ops' make nothing"
    hint = ("a plan needs at least one op: give the loop values" + (f" (--set {used[0]}=...)" if used else "")
            if not vals else None)
    return PlanError.at(loc, "schema", f"the plan's ops expand to nothing: 'for: {clause}' {why}{given}", hint)


def _region_entry(root, src, params, outputs):
    from .expand import Entry
    if not outputs:
        raise PlanError.at(src.loc(("variants",)), "variant", "a plan with top-level 'variants' needs 'outputs'")
    return Entry({"region": root.plan, "variants": root.variants, "outputs": outputs}, params, (), src)


def _regions(ex: Expander, params, dims, tuned, tensors, ops, op_ctx) -> dict[str, Region]:
    out = {}
    by_region: dict[str, list] = {}  # region -> its member ops, in one pass over the ops
    for o in ops:
        for rid in {g[0] for g in op_ctx[o.id]}:
            by_region.setdefault(rid, []).append(o)
    for r in ex.regions:
        variants = []
        members = by_region.get(r.id, [])
        has_coll = {v: any(o.op in COLLECTIVES and (r.id, v) in op_ctx[o.id] for o in members)
                    for v, *_ in r.variants}
        visible = _Union(tensors, r.names)
        for name, when_src, wloc, vloc in r.variants:
            if when_src is None:
                variants.append(Variant(name, None, None, vloc))
                continue
            try:
                ast = parse(when_src)
                uses = check_gate(ast, GateSchema(params, set(dims), tuned, visible))
            except ExprError as e:
                raise _expr_error(e, wloc) from None
            rv = sorted(u for u in uses if u in RANK_VARYING)
            if rv and any(has_coll.values()):
                raise PlanError([Diagnostic(
                    "variant", f"gate of variant '{name}' uses {rv[0]}, which can differ between ranks, but region"
                    f" '{r.id}' has collectives: ranks could pick different variants and hang", wloc,
                    "gate regions with collectives on rank-uniform facts only (params, dims, capturing, tuned.*)")])
            simp = simplify_gate(rename_tensors(ast, r.names), params)
            inner = set(r.outputs) | {n for o in members for n in o.out}
            try:
                check_gate_values(simp, tensors, inner)
            except ExprError as e:
                raise PlanError.at(wloc, e.code, f"gate of variant '{name}': {e.message}") from None
            static = True if simp == parse("true") else False if simp == parse("false") else None
            variants.append(Variant(name, simp, when_src, vloc, static, uses))
        out[r.id] = Region(r.id, variants, r.outputs, loc=r.loc)
    return out
