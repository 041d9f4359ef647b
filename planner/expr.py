"""The expression language used in params, shapes, gates and compact op calls.

A hand-written tokenizer and Pratt parser produce a small AST; nothing is ever
passed to eval(). The same AST serves three purposes:
  - params: evaluated to ints, strings or lists of ints at load time;
  - shapes: folded against params, leaving symbolic dims over dynamic dims
    (e.g. ceil_div(num_tokens, 8));
  - gates: type-checked against the facts schema, partially evaluated against
    params, and compiled to closures (see predicates.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
from collections import ChainMap
from dataclasses import dataclass, field

__all__ = [
    "Expr", "Num", "Str", "Name", "Unary", "Bin", "Call", "Index", "Slice", "ListE",
    "Comp", "ExprError", "parse", "unparse", "free_names", "fold", "eval_int", "evaluate", "FUNCS",
    "Budget", "budget", "current_budget", "depth",
]


class ExprError(Exception):
    """Raised with a column offset into the expression text."""

    def __init__(self, message: str, pos: int = 0, code: str = "expr", hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.pos = pos
        self.code = code
        self.hint = hint


# ---------------------------------------------------------------- AST

@dataclass(frozen=True)
class Expr:
    pos: int = field(default=0, compare=False, repr=False, kw_only=True)


@dataclass(frozen=True)
class Num(Expr):
    value: int


@dataclass(frozen=True)
class Str(Expr):
    value: str


@dataclass(frozen=True)
class Name(Expr):
    id: str  # may be dotted: tuned.kda_two_branch_max


@dataclass(frozen=True)
class Unary(Expr):
    op: str  # '-', 'not'
    x: Expr


@dataclass(frozen=True)
class Bin(Expr):
    op: str  # + - * / // % == != < <= > >= and or
    l: Expr  # noqa: E741 - left operand
    r: Expr


@dataclass(frozen=True)
class Call(Expr):
    fn: str
    args: tuple
    kwargs: tuple = ()  # ((name, Expr), ...)


@dataclass(frozen=True)
class Slice(Expr):
    start: Expr | None
    stop: Expr | None


@dataclass(frozen=True)
class Index(Expr):
    value: Expr
    items: tuple  # Expr or Slice per dimension


@dataclass(frozen=True)
class ListE(Expr):
    items: tuple


@dataclass(frozen=True)
class Comp(Expr):
    """[elt for var in iter if cond]"""
    elt: Expr
    var: str
    iter: Expr
    cond: Expr | None = None


# ---------------------------------------------------------------- tokenizer

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<num>\d[\d_]*)
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*(?:\.[A-Za-z_][A-Za-z_0-9]*)*)
  | (?P<str>'[^'\\\n]*'|"[^"\\\n]*")
  | (?P<op>//|==|!=|<=|>=|\.\.|[-+*/%<>()\[\],:=])
    """,
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in", "for", "if", "true", "false", "True", "False"}
# budgets: every expression and every load is bounded in time and memory (docs/plan-language.md#limits)
MAX_EXPR_LEN = 4096       # characters of one expression
MAX_EXPR_DEPTH = 48       # nesting of parentheses, calls, brackets and prefix operators while parsing
MAX_AST_DEPTH = 200       # height of the tree (a left-associative chain of N terms is N deep)
MAX_STEPS = 2_000_000     # evaluation steps of one load (nodes, list items, comprehension and loop steps)
MAX_LIST = 1_000_000      # items of a list or range
MAX_STR = 65_536          # characters of a string value
MAX_INT = 2**63


class Budget:
    """Evaluation steps left for one load (or one stand-alone evaluate() call)."""

    def __init__(self, steps: int = MAX_STEPS):
        self.limit = steps
        self.left = steps

    def spend(self, n: int, pos: int = 0) -> None:
        self.left -= n
        if self.left < 0:
            raise ExprError(f"the plan needs more than {self.limit:,} evaluation steps (budget 'eval-steps');"
                            " a loop, range or comprehension is too long", pos, "limit")


_CURRENT: contextvars.ContextVar = contextvars.ContextVar("planner_budget", default=None)


@contextlib.contextmanager
def budget(steps: int = MAX_STEPS):
    """All evaluate() calls inside share one Budget (the loader wraps a whole load in this)."""
    b = Budget(steps)
    token = _CURRENT.set(b)
    try:
        yield b
    finally:
        _CURRENT.reset(token)


def current_budget() -> Budget:
    """The shared Budget, or a fresh one outside `budget()`."""
    return _CURRENT.get() or Budget()


@dataclass
class Tok:
    kind: str  # num name str op end
    text: str
    pos: int


def tokenize(text: str) -> list[Tok]:
    if len(text) > MAX_EXPR_LEN:
        raise ExprError(f"expression is {len(text):,} characters long; the limit is {MAX_EXPR_LEN:,}"
                        " (budget 'expr-length')", 0, "limit")
    toks, i = [], 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        after_num = bool(toks) and toks[-1].kind == "num" and toks[-1].pos + len(toks[-1].text) == i
        # 1.5 and 1e-6: a fraction or an exponent right after a number
        if after_num and (not m and text[i] == "." or m and m.lastgroup == "name" and re.fullmatch(r"[eE]\d*", m.group())):
            raise ExprError("numbers in plans are integers (no fractions or exponents); a fractional keyword"
                            " value goes in quotes, e.g. cost_us='1.5' or eps='1e-6'", toks[-1].pos, "type")
        if not m:
            raise ExprError(f"unexpected character {text[i]!r}", i)
        kind = m.lastgroup
        if kind != "ws":
            toks.append(Tok(kind, m.group(), i))
        i = m.end()
    toks.append(Tok("end", "", len(text)))
    return toks


# ---------------------------------------------------------------- parser

# binding powers for binary operators
_BP = {
    "or": 1, "and": 2,
    "==": 4, "!=": 4, "<": 4, "<=": 4, ">": 4, ">=": 4,
    "+": 5, "-": 5,
    "*": 6, "/": 6, "//": 6, "%": 6,
}
_CMP = {"==", "!=", "<", "<=", ">", ">="}


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = tokenize(text)
        self.i = 0
        self.depth = 0

    def peek(self) -> Tok:
        return self.toks[self.i]

    def next(self) -> Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, text: str) -> Tok:
        t = self.next()
        if t.text != text:
            found = "end of expression" if t.kind == "end" else repr(t.text)
            raise ExprError(f"expected '{text}' but found {found}", t.pos)
        return t

    def at(self, text: str) -> bool:
        t = self.peek()
        return t.text == text and t.kind in ("op", "name")

    def expr(self, min_bp: int = 0) -> Expr:
        self.depth += 1
        if self.depth > MAX_EXPR_DEPTH:
            raise ExprError(f"expression nests deeper than {MAX_EXPR_DEPTH} levels (budget 'expr-nesting')",
                          self.peek().pos, "limit")
        left = self.prefix()
        while True:
            t = self.peek()
            op = t.text if t.kind in ("op", "name") else None
            if op not in _BP or _BP[op] <= min_bp:
                break
            self.next()
            right = self.expr(_BP[op])
            if op in _CMP and isinstance(left, Bin) and left.op in _CMP:
                raise ExprError("chained comparisons are not supported; use 'and'", t.pos)
            left = Bin(op, left, right, pos=t.pos)
        self.depth -= 1
        return left

    def prefix(self) -> Expr:
        t = self.next()
        if t.kind == "num":
            return self.postfix(Num(int(t.text.replace("_", "")), pos=t.pos))
        if t.kind == "str":
            return Str(t.text[1:-1], pos=t.pos)
        if t.kind == "name":
            if t.text == "not":
                return Unary("not", self.expr(3), pos=t.pos)
            if t.text in ("true", "True"):
                return Name("true", pos=t.pos)
            if t.text in ("false", "False"):
                return Name("false", pos=t.pos)
            if t.text in _KEYWORDS:
                raise ExprError(f"unexpected keyword '{t.text}'", t.pos)
            if "." in t.text and not t.text.startswith("tuned."):
                raise ExprError(f"attribute access ('{t.text}') is not allowed; only tuned.NAME is dotted", t.pos)
            if self.at("("):
                if "." in t.text:
                    raise ExprError(f"'{t.text}' is not a function", t.pos)
                return self.postfix(self.call(t))
            return self.postfix(Name(t.text, pos=t.pos))
        if t.text == "-":
            return Unary("-", self.expr(7), pos=t.pos)
        if t.text == "+":
            return self.expr(7)
        if t.text == "(":
            e = self.expr()
            self.expect(")")
            return self.postfix(e)
        if t.text == "[":
            if not self.at("]"):
                first = self.expr()
                if self.at("for"):
                    return self.postfix(self.comprehension(first, t.pos))
                items = [first]
                if self.at(","):
                    self.next()
                    items += self.items("]")
                else:
                    self.expect("]")
                return self.postfix(ListE(tuple(items), pos=t.pos))
            self.expect("]")
            return self.postfix(ListE((), pos=t.pos))
        found = "end of expression" if t.kind == "end" else repr(t.text)
        raise ExprError(f"expected a value but found {found}", t.pos)

    def items(self, close: str) -> list[Expr]:
        out = []
        while not self.at(close):
            out.append(self.expr())
            if not self.at(","):
                break
            self.next()
        self.expect(close)
        return out

    def comprehension(self, elt: Expr, pos: int) -> Comp:
        self.expect("for")
        var = self.next()
        if var.kind != "name" or var.text in _KEYWORDS:
            raise ExprError("expected a loop variable after 'for'", var.pos)
        self.expect("in")
        it = self.expr()
        cond = None
        if self.at("if"):
            self.next()
            cond = self.expr()
        self.expect("]")
        return Comp(elt, var.text, it, cond, pos=pos)

    def call(self, name: Tok) -> Call:
        self.expect("(")
        args, kwargs = [], []
        while not self.at(")"):
            t = self.peek()
            if t.kind == "name" and self.toks[self.i + 1].text == "=":
                self.next()
                self.next()
                if any(k == t.text for k, _ in kwargs):
                    raise ExprError(f"keyword '{t.text}' given twice", t.pos)
                kwargs.append((t.text, self.expr()))
            else:
                if kwargs:
                    raise ExprError("positional argument after keyword argument", t.pos)
                args.append(self.expr())
            if not self.at(","):
                break
            self.next()
        self.expect(")")
        return Call(name.text, tuple(args), tuple(kwargs), pos=name.pos)

    def postfix(self, e: Expr) -> Expr:
        while self.at("["):
            t = self.next()
            items = []
            while True:
                items.append(self.subscript())
                if not self.at(","):
                    break
                self.next()
            self.expect("]")
            e = Index(e, tuple(items), pos=t.pos)
        return e

    def subscript(self):
        t = self.peek()
        start = None if self.at(":") else self.expr()
        if not self.at(":"):
            if start is None:
                raise ExprError("empty subscript", t.pos)
            return start
        self.next()
        stop = None if (self.at("]") or self.at(",")) else self.expr()
        return Slice(start, stop, pos=t.pos)


def parse(text: str) -> Expr:
    """The AST of `text` (memoised: a block body inlined 10,000 times is parsed once; ASTs are immutable)."""
    if not isinstance(text, str):
        text = str(text)
    return _parse(text)


@functools.lru_cache(maxsize=1 << 16)  # repeated layers parse the same texts; the trees are frozen
def _parse(text: str) -> Expr:
    p = _Parser(text)
    e = p.expr()
    t = p.peek()
    if t.kind != "end":
        raise ExprError(f"unexpected {t.text!r} after the end of the expression", t.pos)
    # a tree is never taller than its token count: most expressions need no walk
    if len(p.toks) > MAX_AST_DEPTH and depth(e, MAX_AST_DEPTH + 1) > MAX_AST_DEPTH:
        raise ExprError(f"expression is more than {MAX_AST_DEPTH} levels deep (budget 'expr-depth'); a chain of"
                        " that many operators or subscripts: split it over several params", e.pos, "limit")
    return e


def _children(x) -> list:
    if isinstance(x, Unary):
        return [x.x]
    if isinstance(x, Bin):
        return [x.l, x.r]
    if isinstance(x, Call):
        return list(x.args) + [v for _, v in x.kwargs]
    if isinstance(x, ListE):
        return list(x.items)
    if isinstance(x, Index):
        return [x.value, *x.items]
    if isinstance(x, Slice):
        return [s for s in (x.start, x.stop) if s is not None]
    if isinstance(x, Comp):
        return [x.elt, x.iter] + ([x.cond] if x.cond is not None else [])
    return []


def depth(e, stop: int | None = None) -> int:
    """Height of an expression tree (iterative); counting stops at `stop`."""
    best, stack = 0, [(e, 1)]
    while stack:
        x, d = stack.pop()
        if d > best:
            best = d
            if stop is not None and best >= stop:
                return best
        stack.extend((c, d + 1) for c in _children(x))
    return best


# ---------------------------------------------------------------- printing

def unparse(e, parent_bp: int = 0) -> str:
    if isinstance(e, int):
        return str(e)
    if isinstance(e, Num):
        return str(e.value)
    if isinstance(e, Str):
        return repr(e.value)
    if isinstance(e, Name):
        return e.id
    if isinstance(e, Unary):
        s = f"not {unparse(e.x, 3)}" if e.op == "not" else f"-{unparse(e.x, 7)}"
        return s
    if isinstance(e, Bin):
        bp = _BP[e.op]
        s = f"{unparse(e.l, bp - 1 if e.op not in _CMP else bp)} {e.op} {unparse(e.r, bp)}"
        return f"({s})" if bp <= parent_bp else s
    if isinstance(e, Call):
        parts = [unparse(a) for a in e.args] + [f"{k}={unparse(v)}" for k, v in e.kwargs]
        return f"{e.fn}({', '.join(parts)})"
    if isinstance(e, ListE):
        return "[" + ", ".join(unparse(i) for i in e.items) + "]"
    if isinstance(e, Comp):
        cond = f" if {unparse(e.cond)}" if e.cond is not None else ""
        return f"[{unparse(e.elt)} for {e.var} in {unparse(e.iter)}{cond}]"
    if isinstance(e, Slice):
        return f"{'' if e.start is None else unparse(e.start)}:{'' if e.stop is None else unparse(e.stop)}"
    if isinstance(e, Index):
        return f"{unparse(e.value, 9)}[{', '.join(unparse(i) for i in e.items)}]"
    raise TypeError(e)


def free_names(e) -> set[str]:
    out: set[str] = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Name):
            out.add(x.id)
        elif not isinstance(x, Comp):
            stack += _children(x)
        else:
            inner = free_names(x.elt) | (free_names(x.cond) if x.cond is not None else set())
            out |= (inner - {x.var}) | free_names(x.iter)
    return out


# ---------------------------------------------------------------- integer evaluation

def _ceil_div(a, b):
    return -(-a // b)


def _round_up(a, m):
    return _ceil_div(a, m) * m


FUNCS = {
    "ceil_div": (2, _ceil_div),
    "round_up": (2, _round_up),
    "min": (None, min),
    "max": (None, max),
    "range": (None, lambda *a: list(range(*a))),
    "len": (1, len),
}


def _arith(op: str, a, b, pos: int):
    if isinstance(a, bool) or isinstance(b, bool):
        raise ExprError(f"'{op}' needs integers, not booleans", pos, "type")
    if op in ("+",) and isinstance(a, str) and isinstance(b, str):
        return a + b
    if op in ("+",) and isinstance(a, list) and isinstance(b, list):
        return a + b
    if not (isinstance(a, int) and isinstance(b, int)):
        raise ExprError(f"'{op}' needs integers, got {type(a).__name__} and {type(b).__name__}", pos, "type")
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        if abs(a) > 2**62 or abs(b) > 2**62:
            raise ExprError("integer overflow", pos, "param")
        return a * b
    if op in ("/", "//", "%") and b == 0:
        raise ExprError("division by zero", pos, "param")
    if op == "/":
        if a % b:
            raise ExprError(f"{a} / {b} does not divide exactly (use // to floor)", pos, "param")
        return a // b
    if op == "//":
        return a // b
    if op == "%":
        return a % b
    raise ExprError(f"unknown operator {op}", pos)


_CMPF = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def _call(e: Call, args: list, budget: Budget):
    if e.kwargs:
        raise ExprError(f"'{e.fn}' takes no keyword arguments here", e.pos, "type")
    arity, fn = FUNCS[e.fn]
    if arity is not None and len(args) != arity:
        raise ExprError(f"'{e.fn}' takes {arity} arguments, got {len(args)}", e.pos, "type")
    if e.fn in ("min", "max") and not args:
        raise ExprError(f"'{e.fn}' needs at least one argument", e.pos, "type")
    if e.fn in ("ceil_div", "round_up", "range", "min", "max"):
        for a in args:
            if not isinstance(a, int) or isinstance(a, bool):
                raise ExprError(f"'{e.fn}' needs integer arguments", e.pos, "type")
    if e.fn in ("ceil_div", "round_up") and args[1] == 0:
        raise ExprError("division by zero", e.pos, "param")
    if e.fn == "range":
        if not 1 <= len(args) <= 3:
            raise ExprError("'range' takes 1 to 3 arguments", e.pos, "type")
        n = _range_len(*args, pos=e.pos)
        if n > MAX_LIST:
            raise ExprError(f"range({', '.join(map(str, args))}) is too long: {n:,} items; the limit is {MAX_LIST:,}"
                            " (budget 'list-length')", e.pos, "limit")
        budget.spend(n, e.pos)
    if e.fn == "len" and not isinstance(args[0], list):
        raise ExprError("'len' needs a list", e.pos, "type")
    if e.fn in ("min", "max"):
        budget.spend(len(args), e.pos)
    return _check_int(fn(*args), e.pos)


def _range_len(*args, pos: int) -> int:
    """len(range(*args)) without building it (len() overflows past 2**63)."""
    start, stop, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
    if step == 0:
        raise ExprError("range() step must not be zero", pos, "param")
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    return max(0, (start - stop - step - 1) // -step)


def _check_int(v, pos: int):
    if isinstance(v, int) and not isinstance(v, bool) and not -MAX_INT <= v <= MAX_INT:
        raise ExprError(f"integer overflow: {v:.3g} is beyond +-2**63", pos, "param")
    return v


def _sized(v, pos: int, budget: Budget):
    """Charge a made string or list and refuse it past its size budget."""
    if isinstance(v, str):
        if len(v) > MAX_STR:
            raise ExprError(f"a string is too long: {len(v):,} characters; the limit is {MAX_STR:,} (budget 'string-length')",
                            pos, "limit")
        budget.spend(len(v) // 64 + 1, pos)
    elif isinstance(v, list):
        if len(v) > MAX_LIST:
            raise ExprError(f"a list is too long: {len(v):,} items; the limit is {MAX_LIST:,} (budget 'list-length')",
                            pos, "limit")
        budget.spend(len(v) + 1, pos)
    return v


def _concat_size(a, b, pos: int):
    # check before building: doubling a string or list param must be refused, not materialised
    if isinstance(a, str) and isinstance(b, str) and len(a) + len(b) > MAX_STR:
        raise ExprError(f"a string is too long: {len(a) + len(b):,} characters; the limit is {MAX_STR:,}"
                        " (budget 'string-length')", pos, "limit")
    if isinstance(a, list) and isinstance(b, list) and len(a) + len(b) > MAX_LIST:
        raise ExprError(f"a list is too long: {len(a) + len(b):,} items; the limit is {MAX_LIST:,} (budget 'list-length')",
                        pos, "limit")


def _name(e: Name, env):
    if e.id == "true":
        return True
    if e.id == "false":
        return False
    if e.id not in env:
        from .errors import did_you_mean
        raise ExprError(f"unknown name '{e.id}'", e.pos, "name", did_you_mean(e.id, env))
    return env[e.id]


def evaluate(e: Expr, env: dict):
    """Evaluate to a Python value (int, bool, str, list). Unknown names raise 'name'.

    Iterative (an explicit stack, no Python recursion), so a chain of any depth evaluates; every node,
    list item and comprehension step is charged to the current Budget (see `budget()`).
    """
    bud = _CURRENT.get()
    try:  # shallow integer arithmetic (shapes, dims at run time) takes the short path
        v = _fast(e, env, 0, bud or _RUNTIME)
        if bud is not None and bud.left < 0:
            bud.spend(0, e.pos)
        return v
    except _Slow:
        pass
    bud = bud or Budget()
    # work items: (node, env) to evaluate, or (callable, ...) continuations that pop from `vals`
    vals: list = []
    work: list = [(_EVAL, e, env)]
    while work:
        item = work.pop()
        tag = item[0]
        if tag is _EVAL:
            _, x, en = item
            bud.left -= 1
            if bud.left < 0:
                bud.spend(0, x.pos)
            if isinstance(x, Num):
                vals.append(_check_int(x.value, x.pos))
            elif isinstance(x, Str):
                vals.append(_sized(x.value, x.pos, bud))
            elif isinstance(x, Name):
                vals.append(_name(x, en))
            elif isinstance(x, Unary):
                work.append((_UNARY, x))
                work.append((_EVAL, x.x, en))
            elif isinstance(x, Bin):
                if x.op in ("and", "or"):
                    work.append((_SHORT, x, en))
                else:
                    work.append((_BIN, x))
                    work.append((_EVAL, x.r, en))
                work.append((_EVAL, x.l, en))
            elif isinstance(x, Call):
                if x.fn not in FUNCS:
                    from .errors import did_you_mean
                    raise ExprError(f"unknown function '{x.fn}'", x.pos, "name", did_you_mean(x.fn, FUNCS))
                work.append((_CALL, x, len(x.args)))
                work.extend((_EVAL, a, en) for a in reversed(x.args))
            elif isinstance(x, ListE):
                work.append((_LIST, x, len(x.items)))
                work.extend((_EVAL, a, en) for a in reversed(x.items))
            elif isinstance(x, Comp):
                work.append((_COMP, x, en, None, 0, []))
                work.append((_EVAL, x.iter, en))
            elif isinstance(x, Index):
                if len(x.items) != 1 or isinstance(x.items[0], Slice):
                    raise ExprError("only lists can be indexed here, with one integer", x.pos, "type")
                work.append((_INDEX, x))
                work.append((_EVAL, x.items[0], en))
                work.append((_EVAL, x.value, en))
            else:
                raise ExprError(f"{type(x).__name__} is not allowed here", getattr(x, "pos", 0))
        elif tag is _UNARY:
            x = item[1]
            v = vals.pop()
            if x.op == "not":
                vals.append(not _as_bool(v, x.pos))
            elif not isinstance(v, int) or isinstance(v, bool):
                raise ExprError("unary '-' needs an integer", x.pos, "type")
            else:
                vals.append(-v)
        elif tag is _SHORT:
            _, x, en = item
            a = _as_bool(vals.pop(), x.pos)
            if (x.op == "and") != a:  # decided by the left side
                vals.append(a)
            else:
                work.append((_BOOL, x))
                work.append((_EVAL, x.r, en))
        elif tag is _BOOL:
            vals.append(_as_bool(vals.pop(), item[1].pos))
        elif tag is _BIN:
            x = item[1]
            b = vals.pop()
            a = vals.pop()
            if x.op in _CMPF:
                if type(a) is not type(b) and not (isinstance(a, int) and isinstance(b, int)):
                    raise ExprError(f"cannot compare {type(a).__name__} with {type(b).__name__}", x.pos, "type")
                if isinstance(a, (list, str)):
                    bud.spend(min(len(a), len(b)) // 8, x.pos)
                vals.append(_CMPF[x.op](a, b))
            else:
                _concat_size(a, b, x.pos)
                vals.append(_sized(_check_int(_arith(x.op, a, b, x.pos), x.pos), x.pos, bud)
                            if isinstance(a, (str, list)) else _check_int(_arith(x.op, a, b, x.pos), x.pos))
        elif tag is _CALL:
            _, x, n = item
            args = vals[len(vals) - n:]
            del vals[len(vals) - n:]
            vals.append(_call(x, args, bud))
        elif tag is _LIST:
            _, x, n = item
            out = vals[len(vals) - n:]
            del vals[len(vals) - n:]
            vals.append(_sized(out, x.pos, bud))
        elif tag is _INDEX:
            x = item[1]
            i = vals.pop()
            v = vals.pop()
            if not isinstance(v, list):
                raise ExprError("only lists can be indexed here, with one integer", x.pos, "type")
            if not isinstance(i, int) or isinstance(i, bool) or not -len(v) <= i < len(v):
                raise ExprError(f"index {i} out of range for a list of {len(v)}", x.pos, "param")
            vals.append(v[i])
        elif tag is _COMP:
            _, x, en, seq, k, out = item
            if seq is None:  # the iterable just arrived
                seq = vals.pop()
                if not isinstance(seq, list):
                    raise ExprError("a comprehension needs a list to iterate over", x.iter.pos, "type")
            elif k & _TAKE:  # a condition or an element just arrived
                k &= ~_TAKE
                got = vals.pop()
                if k & _ELT:
                    k &= ~_ELT
                    out.append(got)
                    if len(out) > MAX_LIST:
                        _sized(out, x.pos, bud)
                    k += 1
                elif _as_bool(got, x.cond.pos):
                    inner = ChainMap({x.var: seq[k]}, en)
                    work.append((_COMP, x, en, seq, k | _TAKE | _ELT, out))
                    work.append((_EVAL, x.elt, inner))
                    continue
                else:
                    k += 1
            if k >= len(seq):
                vals.append(out)
                continue
            bud.left -= 1
            inner = ChainMap({x.var: seq[k]}, en)
            if x.cond is None:
                work.append((_COMP, x, en, seq, k | _TAKE | _ELT, out))
                work.append((_EVAL, x.elt, inner))
            else:
                work.append((_COMP, x, en, seq, k | _TAKE, out))
                work.append((_EVAL, x.cond, inner))
    return vals[-1]


class _Slow(Exception):
    """The tree is deep or not plain integer arithmetic: evaluate() takes the work-stack path."""


_FAST_DEPTH = 24
_FAST_ARITH = {"+", "-", "*", "//", "%", "/"}
_FAST_CALLS = {"ceil_div", "round_up", "min", "max"}


def _fast(x, env, d: int, bud: Budget):
    # recursion bounded by _FAST_DEPTH; anything else raises _Slow (the iterative path then gives the
    # same value or the same error)
    if d > _FAST_DEPTH:
        raise _Slow
    bud.left -= 1
    t = type(x)
    if t is Num:
        v = x.value
    elif t is Name:
        v = env.get(x.id, _Slow) if type(env) is dict else _Slow
        if type(v) is not int:
            raise _Slow
        return v
    elif t is Bin and x.op in _FAST_ARITH:
        a = _fast(x.l, env, d + 1, bud)
        b = _fast(x.r, env, d + 1, bud)
        op = x.op
        if op == "+":
            v = a + b
        elif op == "-":
            v = a - b
        else:
            v = _arith(op, a, b, x.pos)
    elif t is Call and x.fn in _FAST_CALLS and not x.kwargs:
        args = [_fast(a, env, d + 1, bud) for a in x.args]
        fn = x.fn
        if fn in ("ceil_div", "round_up") and len(args) == 2 and args[1] != 0:
            q = -(-args[0] // args[1])
            v = q if fn == "ceil_div" else q * args[1]
        elif fn in ("min", "max") and args:
            v = min(args) if fn == "min" else max(args)
        else:
            raise _Slow
    else:
        raise _Slow
    if not -MAX_INT <= v <= MAX_INT:
        raise _Slow  # the iterative path reports the overflow
    return v


_RUNTIME = Budget(2**62)  # the short path outside a load (run-time shapes): counted, never exhausted


# continuation tags of evaluate()'s work stack
_EVAL, _UNARY, _SHORT, _BOOL, _BIN, _CALL, _LIST, _INDEX, _COMP = (object() for _ in range(9))
_TAKE, _ELT = 1 << 62, 1 << 61  # flags in a comprehension's counter: a value is waiting / it is an element


def _as_bool(v, pos: int) -> bool:
    if not isinstance(v, bool):
        raise ExprError(f"expected a boolean, got {type(v).__name__} {v!r}", pos, "type")
    return v


# ---------------------------------------------------------------- symbolic dims

def fold(e: Expr, env: dict):
    """Substitute known integer names and fold constants. Returns int or Expr."""
    if isinstance(e, Num):
        return e.value
    if isinstance(e, Name):
        v = env.get(e.id, e)
        if isinstance(v, bool) or isinstance(v, (str, list)):
            raise ExprError(f"'{e.id}' is not an integer", e.pos, "type")
        return v
    if isinstance(e, Unary) and e.op == "-":
        x = fold(e.x, env)
        return -x if isinstance(x, int) else Unary("-", x, pos=e.pos)
    if isinstance(e, Bin) and e.op in ("+", "-", "*", "/", "//", "%"):
        a, b = fold(e.l, env), fold(e.r, env)
        if isinstance(a, int) and isinstance(b, int):
            return _arith(e.op, a, b, e.pos)
        # algebraic identities keep printed shapes short
        if e.op == "*" and (a == 1 or b == 1):
            return b if a == 1 else a
        if e.op in ("+", "-") and b == 0:
            return a
        if e.op == "+" and a == 0:
            return b
        if e.op in ("/", "//") and b == 1:
            return a
        return Bin(e.op, _lift(a), _lift(b), pos=e.pos)
    if isinstance(e, Call) and e.fn in ("ceil_div", "round_up", "min", "max") and not e.kwargs:
        args = [fold(a, env) for a in e.args]
        if all(isinstance(a, int) for a in args):
            return evaluate(Call(e.fn, tuple(Num(a) for a in args), pos=e.pos), {})
        if e.fn in ("ceil_div", "round_up") and len(args) == 2 and args[1] == 1:
            return args[0]
        return Call(e.fn, tuple(_lift(a) for a in args), pos=e.pos)
    raise ExprError(f"'{unparse(e)}' is not an integer expression", getattr(e, "pos", 0), "type")


def _lift(v):
    return Num(v) if isinstance(v, int) else v


def eval_int(dim, bindings: dict) -> int:
    """Evaluate a symbolic dim (int or Expr) against run-time bindings."""
    if isinstance(dim, int):
        return dim
    v = evaluate(dim, bindings)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ExprError(f"'{unparse(dim)}' did not give an integer", dim.pos, "type")
    return v
