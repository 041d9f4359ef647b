"""Gates: type-checked predicates over params and run-time facts, compiled to closures.

A gate is parsed by expr.parse, checked against the facts schema below (unknown
names and type errors are load errors), partially evaluated against params
(`tp_size == 8` folds to true/false at compile time), and compiled into a tree of
Python closures. Nothing is ever eval()'d.

Run-time facts (class Facts): every dynamic dim by name (e.g. num_tokens),
`capturing` (the current stream is capturing a CUDA graph), `cc` (compute
capability as major*10+minor, 0 on CPU), `device` ('cuda' or 'cpu'), `rank`,
`world_size`, `tuned.NAME` (tuned limits), and the functions contiguous(t),
dtype(t), dim(t, i) over the tensors visible to the gate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import did_you_mean
from .expr import Bin, Call, Expr, ExprError, ListE, Name, Num, Str, Unary, unparse
from .shapes import DTYPE_ALIASES, DTYPES, unknown_dtype

__all__ = ["Facts", "GateSchema", "check_gate", "check_gate_values", "simplify_gate", "compile_gate", "RANK_VARYING"]

BUILTIN_FACTS = {"capturing": "bool", "cc": "int", "device": "str", "rank": "int", "world_size": "int"}
GATE_FUNCS = {"contiguous": ("bool", 1), "dtype": ("dtype", 1), "dim": ("int", 2),
              "min": ("int", None), "max": ("int", None), "ceil_div": ("int", 2)}
# facts that can differ between ranks: a gate over a region with collectives must not use them
RANK_VARYING = {"rank", "contiguous", "dtype"}


@dataclass
class Facts:
    """What a gate may ask at run time; filled by the executor for every call."""
    dims: dict = field(default_factory=dict)
    capturing: bool = False
    cc: int = 0
    device: str = "cpu"
    rank: int = 0
    world_size: int = 1
    tuned: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)  # name -> torch.Tensor (or an object with the same API)


@dataclass
class GateSchema:
    params: dict          # name -> int | str | list (static)
    dims: set             # dynamic dim names
    tuned: dict           # name -> default int
    tensors: set          # tensor names visible to the gate


def _type_of(e: Expr, s: GateSchema, uses: set) -> str:
    if isinstance(e, Num):
        return "int"
    if isinstance(e, Str):
        return "str"
    if isinstance(e, Name):
        n = e.id
        uses.add(n)
        if n in ("true", "false"):
            return "bool"
        if n in BUILTIN_FACTS:
            return BUILTIN_FACTS[n]
        if n in s.dims:
            return "int"
        if n.startswith("tuned."):
            key = n[len("tuned."):]
            if key not in s.tuned:
                raise ExprError(f"unknown tuned limit '{key}' (declare it under 'tuned:')", e.pos, "name",
                                did_you_mean(key, s.tuned))
            return "int"
        if n in s.params:
            v = s.params[n]
            return "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else (
                "dtype" if v in DTYPES else "str") if isinstance(v, str) else "list"
        if n in DTYPES or n in DTYPE_ALIASES:
            return "dtype"
        known = list(BUILTIN_FACTS) + list(s.dims) + list(s.params) + [f"tuned.{k}" for k in s.tuned]
        hint = did_you_mean(n, known)
        dmsg, dhint = unknown_dtype(n)
        if hint is None and dhint:  # most likely a dtype written wrong (dtype(x) == fp8)
            raise ExprError(f"unknown name '{n}' in gate: not a dim, param or tuned limit; as a dtype, {dmsg}",
                            e.pos, "name", dhint)
        raise ExprError(f"unknown name '{n}' in gate", e.pos, "name", hint)
    if isinstance(e, Unary):
        t = _type_of(e.x, s, uses)
        want = "bool" if e.op == "not" else "int"
        if t != want:
            raise ExprError(f"'{e.op}' needs {want}, got {t} '{unparse(e.x)}'", e.pos, "type")
        return want
    if isinstance(e, Bin):
        lt, rt = _type_of(e.l, s, uses), _type_of(e.r, s, uses)
        if e.op in ("and", "or"):
            for t, x in ((lt, e.l), (rt, e.r)):
                if t != "bool":
                    raise ExprError(f"'{e.op}' needs booleans, got {t} '{unparse(x)}'", e.pos, "type")
            return "bool"
        if e.op in ("==", "!="):
            if lt != rt:
                raise ExprError(f"cannot compare {lt} '{unparse(e.l)}' with {rt} '{unparse(e.r)}'", e.pos, "type")
            return "bool"
        if e.op in ("<", "<=", ">", ">="):
            if lt != "int" or rt != "int":
                raise ExprError(f"'{e.op}' needs integers, got {lt} and {rt}", e.pos, "type")
            return "bool"
        if lt != "int" or rt != "int":
            raise ExprError(f"'{e.op}' needs integers, got {lt} and {rt}", e.pos, "type")
        return "int"
    if isinstance(e, Call):
        if e.fn not in GATE_FUNCS:
            raise ExprError(f"unknown function '{e.fn}' in gate", e.pos, "name", did_you_mean(e.fn, GATE_FUNCS))
        if e.kwargs:
            raise ExprError(f"'{e.fn}' takes no keyword arguments", e.pos, "type")
        rtype, arity = GATE_FUNCS[e.fn]
        uses.add(e.fn)
        if arity is not None and len(e.args) != arity:
            raise ExprError(f"'{e.fn}' takes {arity} argument(s), got {len(e.args)}", e.pos, "type")
        if e.fn in ("contiguous", "dtype", "dim"):
            t = e.args[0]
            if not isinstance(t, Name) or t.id not in s.tensors:
                name = t.id if isinstance(t, Name) else unparse(t)
                raise ExprError(f"'{e.fn}' needs a tensor name; '{name}' is not a tensor visible here", t.pos, "name",
                                did_you_mean(name, s.tensors))
            if e.fn == "dim" and _type_of(e.args[1], s, uses) != "int":
                raise ExprError("dim(t, i) needs an integer i", e.pos, "type")
        else:
            if not e.args:
                raise ExprError(f"'{e.fn}' needs arguments", e.pos, "type")
            for a in e.args:
                if _type_of(a, s, uses) != "int":
                    raise ExprError(f"'{e.fn}' needs integers", a.pos, "type")
        return rtype
    if isinstance(e, ListE):
        raise ExprError("lists are not allowed in gates", e.pos, "type")
    raise ExprError(f"'{unparse(e)}' is not allowed in a gate", getattr(e, "pos", 0), "type")


def check_gate(e: Expr, schema: GateSchema) -> set:
    """Type-check a gate; returns the names and functions it uses."""
    uses: set = set()
    t = _type_of(e, schema, uses)
    if t != "bool":
        raise ExprError(f"a gate must be a boolean, but '{unparse(e)}' is {t}", e.pos, "type")
    return uses


def check_gate_values(e: Expr, tensors, inner: set) -> None:
    """What a gate's folded form shows wrong before it ever runs: dim(t, i) with a constant i
    outside t's rank (tensors: name -> spec with .rank), a division by a constant zero, and a
    tensor the gate's own region makes (inner: a gate is decided before its region runs)."""
    if isinstance(e, Bin) and e.op == "/":
        raise ExprError(f"'{unparse(e)}': '/' must divide exactly, which a gate over sizes cannot promise; use //"
                        " (floor) or % (remainder), or compare products (2 * x == num_tokens)", e.pos, "type")
    if isinstance(e, Call):
        if e.fn in ("contiguous", "dtype", "dim") and e.args and isinstance(e.args[0], Name):
            t = e.args[0].id
            if t in inner:
                raise ExprError(f"the gate reads '{t}', which its own region makes: a gate is decided before"
                                " the region runs", e.pos, "cycle")
            if e.fn == "dim" and len(e.args) == 2 and not isinstance(e.args[1], Num):
                raise ExprError(f"dim({t}, {unparse(e.args[1])}): the axis must be a constant (an integer or an"
                                " expression of params), not a size or fact of the call", e.pos, "type")
            if e.fn == "dim" and len(e.args) == 2 and isinstance(e.args[1], Num) and t in tensors:
                i, r = e.args[1].value, tensors[t].rank
                if not -r <= i < r:
                    raise ExprError(f"dim({t}, {i}): '{t}' has rank {r}, so its dims are 0..{r - 1}", e.pos, "shape")
        if e.fn == "ceil_div" and len(e.args) == 2 and isinstance(e.args[1], Num) and e.args[1].value == 0:
            raise ExprError(f"'{unparse(e)}' divides by zero", e.pos, "param")
        for a in e.args:
            check_gate_values(a, tensors, inner)
    elif isinstance(e, Bin):
        if e.op in ("//", "/", "%") and isinstance(e.r, Num) and e.r.value == 0:
            raise ExprError(f"'{unparse(e)}' divides by zero", e.pos, "param")
        check_gate_values(e.l, tensors, inner)
        check_gate_values(e.r, tensors, inner)
    elif isinstance(e, Unary):
        check_gate_values(e.x, tensors, inner)


TRUE, FALSE = Name("true"), Name("false")


def simplify_gate(e: Expr, params: dict) -> Expr:
    """Fold params and constant sub-expressions: 'tp_size == 8 and capturing' -> 'capturing' at tp 8."""
    if isinstance(e, Name):
        if e.id in params and e.id not in BUILTIN_FACTS:
            v = params[e.id]
            if isinstance(v, bool):
                return TRUE if v else FALSE
            if isinstance(v, int):
                return Num(v, pos=e.pos)
            if isinstance(v, str):
                return Name(DTYPE_ALIASES.get(v, v), pos=e.pos) if v in DTYPES or v in DTYPE_ALIASES else Str(v, pos=e.pos)
        if e.id in DTYPE_ALIASES:
            return Name(DTYPE_ALIASES[e.id], pos=e.pos)
        return e
    if isinstance(e, Unary):
        x = simplify_gate(e.x, params)
        if e.op == "not" and x in (TRUE, FALSE):
            return FALSE if x == TRUE else TRUE
        if e.op == "-" and isinstance(x, Num):
            return Num(-x.value, pos=e.pos)
        return Unary(e.op, x, pos=e.pos)
    if isinstance(e, Bin):
        a, b = simplify_gate(e.l, params), simplify_gate(e.r, params)
        if e.op == "and":
            if FALSE in (a, b):
                return FALSE
            return b if a == TRUE else a if b == TRUE else Bin("and", a, b, pos=e.pos)
        if e.op == "or":
            if TRUE in (a, b):
                return TRUE
            return b if a == FALSE else a if b == FALSE else Bin("or", a, b, pos=e.pos)
        if _const(a) and _const(b):
            from .expr import evaluate
            v = evaluate(Bin(e.op, a, b), {})
            return (TRUE if v else FALSE) if isinstance(v, bool) else Num(v)
        return Bin(e.op, a, b, pos=e.pos)
    if isinstance(e, Call):
        return Call(e.fn, tuple(simplify_gate(a, params) for a in e.args), e.kwargs, pos=e.pos)
    return e


def _const(e) -> bool:
    return isinstance(e, (Num, Str)) or (isinstance(e, Name) and (e.id in ("true", "false") or e.id in DTYPES))


# ---------------------------------------------------------------- closures

_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "int32": "int32",
                 "int64": "int64", "int8": "int8", "uint8": "uint8", "fp8_e4m3": "float8_e4m3fn",
                 "fp8_e5m2": "float8_e5m2"}
_REVERSE = {v: k for k, v in _TORCH_DTYPES.items()}


def _divisor(d, text: str, f):
    """d, unless it is zero: then the gate's own message, naming the sizes that reach it."""
    if d == 0:
        sizes = ", ".join(f"{k}={v}" for k, v in sorted(getattr(f, "dims", {}).items())) or "these sizes"
        raise ZeroDivisionError(f"gate '{text}' divides by zero at {sizes}")
    return d


def _tensor_dtype(t) -> str:
    name = str(getattr(t, "dtype", "")).replace("torch.", "")
    return _REVERSE.get(name, name)


def _contiguous(t) -> bool:
    return bool(t.is_contiguous())


def rename_tensors(e: Expr, mapping: dict) -> Expr:
    """Map tensor arguments of contiguous/dtype/dim from a block's local names to actual names."""
    if isinstance(e, Call):
        args = tuple(rename_tensors(a, mapping) for a in e.args)
        if e.fn in ("contiguous", "dtype", "dim") and args and isinstance(args[0], Name):
            args = (Name(mapping.get(args[0].id, args[0].id), pos=args[0].pos),) + args[1:]
        return Call(e.fn, args, e.kwargs, pos=e.pos)
    if isinstance(e, Unary):
        return Unary(e.op, rename_tensors(e.x, mapping), pos=e.pos)
    if isinstance(e, Bin):
        return Bin(e.op, rename_tensors(e.l, mapping), rename_tensors(e.r, mapping), pos=e.pos)
    return e


def compile_gate(e: Expr):
    """Closure f(facts) -> value. Shapes of the tree mirror the AST; no eval()."""
    if isinstance(e, Num):
        v = e.value
        return lambda f: v
    if isinstance(e, Str):
        v = e.value
        return lambda f: v
    if isinstance(e, Name):
        n = e.id
        if n == "true":
            return lambda f: True
        if n == "false":
            return lambda f: False
        if n in DTYPES:
            return lambda f: n
        if n in BUILTIN_FACTS:
            return lambda f: getattr(f, n)
        if n.startswith("tuned."):
            key = n[len("tuned."):]
            return lambda f: f.tuned[key]
        return lambda f: f.dims[n]
    if isinstance(e, Unary):
        x = compile_gate(e.x)
        return (lambda f: not x(f)) if e.op == "not" else (lambda f: -x(f))
    if isinstance(e, Bin):
        a, b = compile_gate(e.l), compile_gate(e.r)
        op = e.op
        if op == "and":
            return lambda f: a(f) and b(f)
        if op == "or":
            return lambda f: a(f) or b(f)
        import operator as o
        fn = {"==": o.eq, "!=": o.ne, "<": o.lt, "<=": o.le, ">": o.gt, ">=": o.ge,
              "+": o.add, "-": o.sub, "*": o.mul, "//": o.floordiv, "/": o.floordiv, "%": o.mod}[op]
        if op in ("//", "/", "%"):
            text = unparse(e)
            return lambda f: fn(a(f), _divisor(b(f), text, f))
        return lambda f: fn(a(f), b(f))
    if isinstance(e, Call):
        if e.fn in ("contiguous", "dtype", "dim"):
            tname = e.args[0].id
            if e.fn == "contiguous":
                return lambda f: _contiguous(f.tensors[tname])
            if e.fn == "dtype":
                return lambda f: _tensor_dtype(f.tensors[tname])
            i = compile_gate(e.args[1])
            return lambda f: int(f.tensors[tname].shape[i(f)])
        args = [compile_gate(a) for a in e.args]
        if e.fn == "ceil_div":
            x, y = args
            text = unparse(e)
            return lambda f: -(-x(f) // _divisor(y(f), text, f))
        fn = min if e.fn == "min" else max
        return lambda f: fn(a(f) for a in args)
    raise TypeError(f"cannot compile {e!r}")
