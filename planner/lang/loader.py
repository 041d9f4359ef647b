"""Load a plan file into a validated Plan: params, dims, tensors, ops with shapes.

load_plan() is the single entry point. Every failure is a PlanError with a
location; nothing from the plan is executed.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import ValidationError

from ..config import MAX_STREAMS
from ..errors import Diagnostic, Loc, PlanError, did_you_mean
from ..expr import ExprError, budget, free_names, parse
from ..infer import check_inplace, infer_all
from ..ir import Plan, Region, Variant
from ..ops import COLLECTIVES, OP_MODELS
from ..predicates import (
    RANK_VARYING,
    GateSchema,
    check_gate,
    check_gate_values,
    rename_tensors,
    simplify_gate,
)
from ..shapes import DTYPES, Probes, TensorSpec, fmt_dim
from .document import load_tree, type_words
from .expand import FOR_CLAUSE, IDENT, Expander
from .sections import (
    dims_of,
    eval_params,
    expand_keys,
    expr_error,
    group_params_of,
    groups_of,
    tensor_decl,
)

__all__ = ["load_plan", "parse_overrides"]

_POOL = re.compile(r"^(main|aux([1-9]\d*)?)$")  # the planner's pool names, usable without a 'streams:' list
# the executor call's own keyword arguments (executors.executor.Executor.__call__): no input may take them
CALL_KEYWORDS = {"self", "dims", "out", "_facts"}


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

    params = eval_params(merged("params"), overrides)
    dims = dims_of(merged("dims"), params)
    groups = groups_of(merged("groups"), params)
    group_params = group_params_of(merged("groups"), params)
    param_choices = {k: list(v["choices"]) for k, (v, _, _) in merged("params").items()
                     if isinstance(v, dict) and isinstance(v.get("choices"), list)}
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
        for name, raw, p in expand_keys(getattr(root, section), root_src, (section,), params, ex):
            if not IDENT.fullmatch(name):
                raise PlanError.at(root_src.loc(p), "schema", f"'{name}' is not a valid tensor name"
                                   " (ASCII letters, digits and _, not starting with a digit)")
            if kind == "input" and name in CALL_KEYWORDS:
                raise PlanError.at(root_src.loc(p), "schema", f"input '{name}' cannot be passed by name: the"
                                   f" executor call takes '{name}' as its own argument (ex(dims=..., out=...,"
                                   " <input>=tensor))", "rename the input")
            if name in tensors:
                raise PlanError.at(root_src.loc(p), "dup", f"tensor '{name}' is declared twice")
            tensors[name] = tensor_decl(name, raw, kind, root_src, p, params, dims, probes)
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
    check_inplace(ops, tensors, outputs, locs, field_locs, op_ctx)
    regions = _regions(ex, params, dims, tuned, tensors, ops, op_ctx)
    return Plan(
        name=root.plan, file=root_src.file, params=params, dims=dims, groups=groups, tuned=tuned,
        tensors=tensors, inputs=inputs, weights=weights, outputs=outputs, ops=ops, regions=regions,
        op_ctx=op_ctx, locs=locs, doc=root.doc, streams=root.streams and declared, includes=[s.file for s, _ in tree[:-1]],
        group_params=group_params, param_choices=param_choices,
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
    word = ("is not a field of this op" if e["type"] == "extra_forbidden"
            else type_words(e) or e["msg"][:1].lower() + e["msg"][1:])
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
        for n, _, _ in expand_keys({o: None}, src, ("outputs", i), params, ex):
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
                raise expr_error(e, wloc) from None
            rv = sorted(u for u in uses if u in RANK_VARYING)
            if rv and any(has_coll.values()):
                raise PlanError([Diagnostic(
                    "variant", f"gate of variant '{name}' uses {' and '.join(rv)}, which can differ between ranks, but region"
                    f" '{r.id}' has collectives: ranks could pick different variants and hang", wloc,
                    "gate regions with collectives on rank-uniform facts only (params, dims, capturing, tuned.*)")])
            inner = set(r.outputs) | {n for o in members for n in o.out}
            try:
                simp = simplify_gate(rename_tensors(ast, r.names), params)
                check_gate_values(simp, tensors, inner)
            except ExprError as e:
                raise PlanError.at(wloc, e.code, f"gate of variant '{name}': {e.message}") from None
            static = True if simp == parse("true") else False if simp == parse("false") else None
            variants.append(Variant(name, simp, when_src, vloc, static, uses))
        out[r.id] = Region(r.id, variants, r.outputs, loc=r.loc, within=r.within)
    return out
