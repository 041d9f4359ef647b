"""A built Executor as torch custom ops, so torch.compile traces a call as one opaque node.

build_executor registers two ops per executor in the `planner` namespace (one Library):

    planner::<plan>_<digest>_<n>(Tensor <input>, ..., SymInt? <dim>=None, ...) -> Tensor[]
    planner::<plan>_<digest>_<n>_out(Tensor <input>, ..., SymInt? <dim>=None, ..., Tensor(a0!) <output>, ...) -> ()

(<digest>: of the inputs, params and returned layouts, so a plan built with other params, in this
process or another, has other names: Inductor's on-disk caches know an op by its name.)

User code does not change: `ex(x=...)` checks torch.compiler.is_compiling() and, while Dynamo
traces, calls the op instead of walking the schedule (Executor.__call__). What the op takes:
the plan's inputs (in plan order) and, optionally, each plan dim as a SymInt (the `dims=` of a
call; a dim derived only through ceil_div and the like must be passed, as in eager). Weights
are not arguments: the op closes over its executor (a weak reference), so Dynamo guards on
the executor object once, not on weight tensors, and loading new weights in place
(Executor.load_weights) needs no recompile.

The fake (meta) kernel evaluates the plan's output shape expressions on the inputs' SymInt
sizes and returns tensors with the layout a run gives: each output has the strides of the
buffer it is a view of (the fallback variant's; mixed_qkv of the KDA plan is a column view of
the [num_tokens, 6288] packed projection). A run whose variant made another layout (the
two-branch KDA variant, taken only when tuned to) copies that output into the declared layout;
ex.op_layout_copies counts those copies. Outputs never alias inputs or weights (such an output
is cloned); several outputs may be disjoint views of one buffer (no output overlaps another).
Plan inputs that model code run for its effects (extern effects=true: a KV-cache write) is given
are declared written (Tensor(m0!)), so the compiled graph keeps the call and orders reads of
them after it; such code given a weight, or a plan with no outputs (Inductor may drop the call),
is refused under torch.compile.

Run-time behaviour stays in the body: streams, events, gates (which read the real capture
state, torch.cuda.is_current_stream_capturing(), when the op runs, not Dynamo's trace) and the
input check of Executor.check_inputs (the fake kernel checks dtype, device, rank and declared
contiguity at trace time; sizes are checked when the op runs). Side-stream work is joined to
the caller's current stream before the op returns.

Capture: inside torch.cuda.graph, under mode="reduce-overhead" and in a piecewise layout the
op is safe when (1) the executor was called once outside capture with the same variant set
(warm-up: cuBLAS handles, kernel compiles and the side streams' first use happen there) and
(2) capture_error_mode is "global" or "thread_local" (the default "global" is what
torch.cuda.graph and vLLM use). Under "relaxed" nothing changes. Not safe: calling the op
with inputs on another device than the executor's, or from two threads that capture at once
on the same executor (the side streams and events are per executor).
"""

from __future__ import annotations

import hashlib
import itertools
import keyword
import operator
import re
import weakref

import torch

from planner.expr import Bin, Call, Name, Num, Unary, fold, parse
from planner.graph import storage_root

from .dims import shape_fn
from .dtypes import TORCH_DTYPES, plan_dtype, torch_dtype
from .errors import InputError
from .overlap import overlaps, storage_key

__all__ = ["register_ops", "compiled_call", "check_out", "write_outputs", "sym_eval", "describe", "dims_arg"]

_LIB: torch.library.Library | None = None
_DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_COUNT = itertools.count()


def _lib() -> torch.library.Library:
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library("planner", "FRAGMENT")
    return _LIB


# words a schema argument may not be named (the schema parser's and Python's: Inductor makes
# Python functions with these parameter names)
_RESERVED = set(keyword.kwlist) | {"None", "True", "False", "in", "out", "self", "Tensor", "SymInt", "int",
                                   "float", "bool", "str", "Scalar", "Layout", "Device", "MemoryFormat"}


def _ident(s: str, taken: set) -> str:
    out = re.sub(r"\W", "_", s)
    if not out or out[0].isdigit() or out in _RESERVED:
        out = "_" + out
    while out in taken:
        out += "_"
    taken.add(out)
    return out


# ------------------------------------------------------------------ shapes on SymInts

def sym_eval(e, b: dict):
    """A plan dim expression on ints or SymInts (planner.expr.eval_int insists on ints)."""
    if isinstance(e, int):
        return e
    if isinstance(e, Num):
        return e.value
    if isinstance(e, Name):
        return b[e.id]
    if isinstance(e, Unary) and e.op == "-":
        return -sym_eval(e.x, b)
    if isinstance(e, Bin):
        x, y = sym_eval(e.l, b), sym_eval(e.r, b)
        if e.op == "+":
            return x + y
        if e.op == "-":
            return x - y
        if e.op == "*":
            return x * y
        if e.op in ("//", "/"):
            return x // y
        if e.op == "%":
            return x % y
    if isinstance(e, Call):
        a = [sym_eval(x, b) for x in e.args]
        if e.fn == "ceil_div":
            return (a[0] + a[1] - 1) // a[1]
        if e.fn == "round_up":
            return (a[0] + a[1] - 1) // a[1] * a[1]
        if e.fn == "min":
            return _fold(torch.sym_min, a)
        if e.fn == "max":
            return _fold(torch.sym_max, a)
    raise InputError(f"dim expression {e!r} cannot be evaluated on symbolic sizes")


def _fold(fn, a):
    v = a[0]
    for x in a[1:]:
        v = fn(v, x)
    return v


def _contig_strides(shape) -> tuple:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc = acc * d
    return tuple(reversed(out))


def _expr(v, params):
    if isinstance(v, int):
        return v
    return fold(parse(v) if isinstance(v, str) else v, params)


def _view_chain(cp, name: str):
    """(root buffer, [view steps from the root to `name`]): follow split/slice/view ops, and
    through a region's select the fallback (last) variant's tensor. A step is
    ("narrow", dim, [offset terms], length) or ("view", shape)."""
    g, params = cp.graph, cp.plan.params
    steps = []
    for _ in range(256):
        spec = cp.tensors[name]
        p = spec.producer
        op = g.nodes[p]["op"] if p is not None and p in g else None
        if op is None or spec.kind in ("input", "weight"):
            break
        if op.op == "select":
            name = op.choices[-1]
            continue
        if op.op == "split":
            src = cp.tensors[op.x]
            d = op.dim % len(src.shape)
            i = op.out.index(name)
            offs = [cp.tensors[o].shape[d] for o in op.out[:i]]
            steps.append(("narrow", d, offs, spec.shape[d]))
            name = op.x
            continue
        if op.op == "slice":
            src = cp.tensors[op.x]
            d = op.dim % len(src.shape)
            steps.append(("narrow", d, [_expr(op.start, params)], spec.shape[d]))
            name = op.x
            continue
        if op.op == "view":
            steps.append(("view", spec.shape))
            name = op.x
            continue
        break
    return name, steps[::-1]


class _OpSpec:
    """What the op needs of its executor, computed once at registration.

    The functional op returns one tensor per distinct buffer the outputs are views of (its
    `roots`, each contiguous at its plan shape); the caller's side (compiled_call) takes the
    views, so no two returned tensors alias and the views cost nothing in the compiled graph."""

    def __init__(self, ex):
        cp, plan = ex.compiled, ex.plan
        self.inputs = list(plan.inputs)
        self.dims = list(plan.dims)
        self.outputs = list(plan.outputs)
        self.out_dtype = {o: torch_dtype(cp.tensors[o].dtype) for o in self.outputs}
        self.roots: list[str] = []
        self.chain: dict[str, tuple[int, list]] = {}  # output -> (root index, view steps)
        for o in self.outputs:
            r, steps = _view_chain(cp, o)
            if cp.tensors[r].kind in ("input", "weight"):
                r, steps = o, []  # a view of an argument or a weight: returned as a copy
            if r not in self.roots:
                self.roots.append(r)
            self.chain[o] = (self.roots.index(r), steps)
        self.copy_roots = {r for r in self.roots if cp.tensors[r].kind in ("input", "weight") or r in plan.inputs}
        # what model code run for its effects (effects=true: a KV-cache write) is given: the plan
        # inputs among it are declared written by the op (so the compiled graph keeps the call and
        # orders reads of them after it); weights among it cannot be (they are not arguments)
        self.mutated, self.effect_weights = [], []
        for op in plan.ops:
            if op.op == "extern" and op.effects:
                for a in op.args if op.writes is None else op.writes:
                    r = storage_root(cp, a)
                    kind = cp.tensors[r].kind if r in cp.tensors else None
                    if kind == "input" and r not in self.mutated:
                        self.mutated.append(r)
                    elif kind == "weight" and (op.id, r) not in self.effect_weights:
                        self.effect_weights.append((op.id, r))
        self.effects = [op.id for op in plan.ops if op.op == "extern" and op.effects]
        self.root_shape = [cp.tensors[r].shape for r in self.roots]
        self.root_dtype = [torch_dtype(cp.tensors[r].dtype) for r in self.roots]
        self._root_fns = [shape_fn(sh, plan.params) for sh in self.root_shape]
        self.out_shape = {o: cp.tensors[o].shape for o in self.outputs}
        # input axes that are a bare dim name: how a traced call binds a dim not passed
        self.direct = {}
        for n in self.inputs:
            for ax, d in enumerate(plan.tensors[n].shape):
                if isinstance(d, Name) and d.id in plan.dims:
                    self.direct.setdefault(d.id, (n, ax))

    def views(self, roots: list, b: dict) -> dict:
        """{output: view of its root} at bindings b (ints or SymInts)."""
        out = {}
        for o in self.outputs:
            i, steps = self.chain[o]
            t = roots[i]
            if t is None:  # a partial list: outputs of the given roots only
                continue
            for st in steps:
                if st[0] == "narrow":
                    _, d, offs, length = st
                    t = t.narrow(d, sum(sym_eval(x, b) for x in offs), sym_eval(length, b))
                else:
                    t = t.view(tuple(sym_eval(x, b) for x in st[1]))
            out[o] = t
        return out

    def root_layout(self, i: int, b: dict, sym: bool):
        shape = tuple(sym_eval(d, b) for d in self.root_shape[i]) if sym else self._root_fns[i](b)
        return shape, _contig_strides(shape)


def _schema(ex, spec: _OpSpec):
    taken: set = set()
    ins = [_ident(n, taken) for n in spec.inputs]
    dims = [_ident(d, taken) for d in spec.dims]
    outs = [_ident(o, taken) for o in spec.outputs]
    written = {n: f"(m{i}!)" for i, n in enumerate(spec.mutated)}
    tin = [f"Tensor{written.get(n, '')} {a}" for n, a in zip(spec.inputs, ins, strict=True)]
    args = tin + [f"SymInt? {d}=None" for d in dims]
    # one tensor per root buffer (_OpSpec); an op that writes inputs returns a fixed tuple (a
    # written op's Tensor[] return cannot be functionalized)
    n = len(spec.roots)
    ret = "Tensor[]" if not spec.mutated else "()" if n == 0 else "Tensor" if n == 1 else f"({', '.join(['Tensor'] * n)})"
    fn = f"({', '.join(args)}) -> {ret}"
    mut = ", ".join(tin + [f"SymInt? {d}" for d in dims] + [f"Tensor(a{i}!) {o}" for i, o in enumerate(outs)])
    return fn, f"({mut}) -> ()"


def _digest(ex, spec: _OpSpec) -> str:
    """8 hex digits of what the op's schema and fake kernel depend on (the inputs, the params the
    shapes read, the returned buffers and views, the device): Inductor's on-disk caches know a
    custom op by its name, so a plan of the same name built with other params in another process
    must not share it."""
    plan = ex.plan
    ins = [(n, plan.tensors[n].dtype, plan.tensors[n].shape, plan.tensors[n].contiguous) for n in spec.inputs]
    what = (ins, spec.dims, sorted(plan.params.items()), spec.outputs, spec.chain, spec.root_shape,
            spec.root_dtype, str(ex.device))
    return hashlib.sha1(repr(what).encode()).hexdigest()[:8]


def register_ops(ex):
    """Define and implement planner::<plan>_<digest>_<n> and its _out form for `ex`; returns the
    two OpOverloads. Called by build_executor (registration inside a Dynamo trace is not allowed)."""
    spec = _OpSpec(ex)
    base = re.sub(r"\W", "_", ex.plan.name) + f"_{_digest(ex, spec)}_{next(_COUNT)}"
    fn_schema, out_schema = _schema(ex, spec)
    lib = _lib()
    lib.define(base + fn_schema)
    lib.define(base + "_out" + out_schema)
    ref = weakref.ref(ex)
    n_in, n_d = len(spec.inputs), len(spec.dims)

    def split(args, concrete=True):
        args = tuple(args) + (None,) * (n_in + n_d - len(args))  # trailing defaults may be dropped
        inputs = dict(zip(spec.inputs, args[:n_in], strict=True))
        dims = {d: (int(v) if concrete else v) for d, v in zip(spec.dims, args[n_in:n_in + n_d], strict=True)
                if v is not None}
        return inputs, (dims or None)

    def executor():
        e = ref()
        if e is None:
            raise RuntimeError(f"planner::{base}: its executor was garbage-collected; keep a reference to it")
        return e

    def impl(*args):
        e = executor()
        inputs, dims = split(args)
        b = e.check_inputs(inputs, dims)
        env = e._run(inputs, dims, keep=spec.roots)
        # a returned buffer must not be an input's or a weight's memory, nor another returned
        # buffer's (a view op or model code can hand one back): the op's schema promises fresh,
        # unaliased tensors
        held = {storage_key(t) for t in inputs.values() if t.numel()} | e._weight_storage.keys()
        outs = []
        for i, r in enumerate(spec.roots):
            t = env.get(r)
            shape, strides = spec.root_layout(i, b, False)
            if (t is None or r in spec.copy_roots or (t.numel() and storage_key(t) in held)
                    or not _same_layout(t, shape, strides)
                    or not _views_match(spec, i, t, env, b)):
                # another variant ran (or the buffer is not laid out as declared): the root in the
                # declared layout, each output copied into its view of it
                t = torch.empty_strided(shape, strides, dtype=spec.root_dtype[i], device=e.device)
                for o, v in spec.views([t if j == i else None for j in range(len(spec.roots))], b).items():
                    v.copy_(env[o])
                e.op_layout_copies += 1
            if t.numel():
                held.add(storage_key(t))  # a later root in the same memory (model code returned it twice) is copied
            outs.append(t)
        return _returned(spec, outs)

    def fake(*args):
        e = executor()
        inputs, dims = split(args, False)
        b = bindings(e, spec, inputs, dims, fake=True)
        return _returned(spec, [torch.empty_strided(*spec.root_layout(i, b, True), dtype=spec.root_dtype[i],
                                                    device=e.device) for i in range(len(spec.roots))])

    def impl_out(*args):
        e = executor()
        inputs, dims = split(args)
        b = e.check_inputs(inputs, dims)
        out = dict(zip(spec.outputs, args[n_in + n_d:], strict=True))
        check_out(e, out, b, inputs)
        write_outputs(e, e._run(inputs, dims), out)

    def fake_out(*args):
        e = executor()
        inputs, dims = split(args, False)
        bindings(e, spec, inputs, dims, fake=True)

    lib.impl(base, impl, "CompositeExplicitAutograd")
    lib.impl(base + "_out", impl_out, "CompositeExplicitAutograd")
    torch.library.register_fake(f"planner::{base}", fake, lib=lib)
    torch.library.register_fake(f"planner::{base}_out", fake_out, lib=lib)
    pkt = getattr(torch.ops.planner, base)
    pkt_out = getattr(torch.ops.planner, base + "_out")
    return pkt.default, pkt_out.default, spec


def _returned(spec: _OpSpec, outs: list):
    """The roots as the schema returns them (_schema): a list, or for an op that writes inputs a
    tuple, one tensor, or nothing."""
    if not spec.mutated:
        return outs
    return None if not outs else outs[0] if len(outs) == 1 else tuple(outs)


def _roots(spec: _OpSpec, res) -> list:
    if res is None:
        return []
    return [res] if isinstance(res, torch.Tensor) else list(res)


def describe(t) -> str:
    """bf16[2, 256] non-contiguous on cpu: a tensor as the input check names it."""
    contig = "" if t.is_contiguous() else " non-contiguous"
    return f"{_DTYPE_NAMES.get(t.dtype, t.dtype)}{list(t.shape)}{contig} on {t.device}"


def _same_layout(t, shape, strides) -> bool:
    if tuple(t.shape) != tuple(shape):
        return False
    return all(s == w for s, w, n in zip(t.stride(), strides, shape, strict=True) if n > 1)


def _views_match(spec: _OpSpec, i: int, root, env: dict, b: dict) -> bool:
    """Every output of root i is the view of `root` the traced code will take."""
    for o, v in spec.views([root if j == i else None for j in range(len(spec.roots))], b).items():
        t = env[o]
        if t.data_ptr() != v.data_ptr() or not _same_layout(t, v.shape, v.stride()):
            return False
    return True


def bindings(ex, spec: _OpSpec, inputs: dict, dims: dict | None, fake: bool = False) -> dict:
    """The dim bindings of a traced call (SymInts): dims= first, else a bare-dim input axis.
    With fake, also the trace-time input check (dtype, device, rank, declared contiguity)."""
    if fake:
        for name, (dt, dev, nd, contig, what) in ex._checks.items():
            t = inputs[name]
            if t.dtype != dt or t.device != dev or t.dim() != nd or (contig and not t.is_contiguous()):
                raise InputError(f"plan '{ex.plan.name}': input '{name}' must be {what}; got {describe(t)}")
    b = {k: v for k, v in (dims or {}).items() if v is not None}
    for d in spec.dims:
        if d in b:
            continue
        if d not in spec.direct:
            raise InputError(f"plan '{ex.plan.name}': dim '{d}' is derived in every input shape; pass "
                             f"dims={{'{d}': N}} to the call (a SymInt under torch.compile)")
        n, ax = spec.direct[d]
        b[d] = inputs[n].shape[ax]
    return b


def dims_arg(ex, dims, sym: bool = False) -> dict | None:
    """A call's dims=: None or {plan dim: int} (a SymInt too under torch.compile); a None value
    is a dim not given. Raises InputError for anything else."""
    if dims is None:
        return None
    name = ex.plan.name
    if not isinstance(dims, dict):
        raise InputError(f"plan '{name}': dims= must be a dict {{dim: int}}, got {type(dims).__name__}")
    bad = [d for d in dims if d not in ex.plan.dims]
    if bad:
        raise InputError(f"plan '{name}': dims= names {bad} but the plan's dims are {sorted(ex.plan.dims)}")
    out = {}
    for d, v in dims.items():
        if v is None:
            continue
        if isinstance(v, (bool, float, str, bytes, list, tuple, dict)):
            raise InputError(f"plan '{name}': dims['{d}'] must be an int, got {type(v).__name__} {v!r:.40}")
        if sym:  # a SymInt under Dynamo: taken as is (operator.index would specialize it)
            out[d] = v
            continue
        try:
            out[d] = operator.index(v)
        except TypeError:
            raise InputError(f"plan '{name}': dims['{d}'] must be an int, got {type(v).__name__} {v!r:.40}") from None
    return out or None


def _out_names(ex, out, outputs) -> None:
    if not isinstance(out, dict) or set(out) != set(outputs):
        got = sorted(out) if isinstance(out, dict) else type(out).__name__
        raise InputError(f"plan '{ex.plan.name}': out= must be a dict naming the outputs {outputs}; got {got}")


def compiled_call(ex, inputs: dict, dims: dict | None, out: dict | None):
    """What Executor.__call__ does under Dynamo: one op call, outputs as a dict."""
    spec = ex._op_spec
    if len(inputs) != len(spec.inputs) or any(n not in inputs for n in spec.inputs):
        raise InputError(f"plan '{ex.plan.name}' takes inputs {spec.inputs}; got {sorted(inputs)}")
    args = [inputs[n] for n in spec.inputs]
    for n, t in zip(spec.inputs, args, strict=True):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"plan '{ex.plan.name}': input '{n}' must be a tensor {ex._checks[n][4]}, got {type(t).__name__}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in args):
        grads = [n for n, t in zip(spec.inputs, args, strict=True) if t.requires_grad]
        raise InputError(f"plan '{ex.plan.name}': inputs {grads} require grad, but under torch.compile the plan is"
                         " one custom op without a backward; call it under torch.no_grad() or"
                         " torch.inference_mode(), or pass detached inputs (eager calls are differentiable)")
    if spec.effect_weights:
        op, w = spec.effect_weights[0]
        raise InputError(f"plan '{ex.plan.name}': model code '{op}' (effects=true) is given weight '{w}', whose writes"
                         " torch.compile cannot see (weights are not the op's arguments); declare that"
                         " state as a plan input (the op then declares it written), or call the executor"
                         " outside the compiled region")
    if spec.effects and not spec.outputs:
        raise InputError(f"plan '{ex.plan.name}' has no outputs, only model code run for effects"
                         f" ({', '.join(spec.effects)}): Inductor may drop a call whose results nothing reads"
                         " (it did with dynamic shapes under no_grad, though the op declares its writes); give the"
                         " plan an output the model reads, or call the executor outside the compiled region")
    dims = dims_arg(ex, dims, sym=True)
    dv = [None if dims is None else dims.get(d) for d in spec.dims]
    if out is not None:
        _out_names(ex, out, spec.outputs)
        ex._op_out(*args, *dv, *[out[o] for o in spec.outputs])
        return out
    roots = _roots(spec, ex._op(*args, *dv))
    return spec.views(roots, bindings(ex, spec, inputs, dims))


def check_out(ex, out, b: dict, inputs: dict):
    """The out= tensors of a call at bindings b: every output named, its shape, dtype and device,
    and no two of them, and none with an input or a weight, sharing memory (the outputs are
    copied in turn, so an overlap would hand back a value another copy overwrote)."""
    spec = ex._op_spec or _OpSpec(ex)
    _out_names(ex, out, spec.outputs)
    for o in spec.outputs:
        dst, shape = out[o], tuple(sym_eval(d, b) for d in spec.out_shape[o])
        if (not isinstance(dst, torch.Tensor) or tuple(dst.shape) != tuple(shape) or dst.dtype != spec.out_dtype[o]
                or dst.device != ex.device):
            got = (f"{plan_dtype(dst.dtype)}{list(dst.shape)} on {dst.device}" if isinstance(dst, torch.Tensor)
                   else type(dst).__name__)
            raise InputError(f"plan '{ex.plan.name}': out['{o}'] must be {plan_dtype(spec.out_dtype[o])}"
                             f"{list(shape)} on {ex.device}; got {got}")
    others = [(f"out['{o}']", out[o]) for o in spec.outputs] + [(f"input '{n}'", t) for n, t in inputs.items()]
    for i, o in enumerate(spec.outputs):
        same = ex._weight_storage.get(storage_key(out[o]), ()) if out[o].numel() else ()  # usually none
        for what, t in others[i + 1:] + [(f"weight '{n}'", ex._weights[n]) for n in same]:
            if isinstance(t, torch.Tensor) and overlaps(out[o], t):
                raise InputError(f"plan '{ex.plan.name}': out['{o}'] shares memory with {what}; give each output"
                                 " its own memory, apart from the inputs and weights")


def write_outputs(ex, res: dict, out: dict) -> dict:
    """The out= form: copy each output into the caller's tensor (checked by check_out)."""
    for name, t in res.items():
        out[name].copy_(t)
    return out
