"""Lower a compiled plan to a callable: build_executor(compiled, weights, ...) -> Executor.

Build time does everything that does not depend on the call: pick an implementation
per op through the registry, fold symbolic attributes, compile gates, bind plan
groups to process groups (and agree on the plan hash), create one event per site.
The call itself is executors.executor.Executor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import networkx as nx
import torch

from planner.opbase import written_in_place
from planner.ops import COLLECTIVES
from planner.verify import verify

from .backends import backend_names, lookup
from .backends.allreduce_norm import tuned_allreduce_norm
from .collectives import (
    agree_on_plan,
    bind_groups,
    check_group_sizes,
    check_shared_groups,
    plan_description,
)
from .custom_op import register_ops
from .dims import DimSolver, dim_fn
from .dtypes import torch_dtype
from .errors import BuildError
from .executor import Executor, Step
from .gating import compile_regions
from .overlap import unshared
from .streams import MAIN
from .tuning import gemm_table, keyed_table, resolve_tuning, tuned_gemm, tuned_keyed
from .weights import ROW, layout_gemm, layout_of_tensor, prepare_weights

__all__ = ["build_executor", "Executor", "BuildError", "default_schedule"]

VIEW_KINDS = {"split", "slice", "view", "select"}


def default_schedule(cp) -> list[str]:
    """Plan order made topological: the schedule when no planner pass set one."""
    order = {op.id: i for i, op in enumerate(cp.plan.ops)}
    return list(nx.lexicographical_topological_sort(cp.graph, key=lambda v: order.get(v, 0)))


class _BuildCtx:
    def __init__(self, cp, device, comms, externs, weights=None, layouts=None):
        self.params = cp.plan.params
        self.dims = cp.plan.dims
        self.specs = cp.tensors
        self.device = device
        self.weights = weights or {}  # the plan's prepared weights on the device (executors.weights)
        self.layouts = layouts or {}  # {weight: layout} of those weights
        self._comms = comms
        self._externs = externs

    def comm(self, group: str):
        return self._comms[group]

    def extern(self, name: str):
        return self._externs[name]


def resolve_device(device, weights) -> torch.device:
    """build_executor's device=: checked (BuildError), plain 'cuda' as the current GPU; None takes
    the first weight's device."""
    if device is None:
        w = next(iter(weights.values()), None)
        device = w.device if w is not None else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise BuildError(f"device={device!r} is not a torch device: {exc}") from None
    if dev.type not in ("cpu", "cuda"):
        raise BuildError(f"device={device!r}: executors run on cpu or cuda, not {dev.type}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BuildError(f"device={device!r} but CUDA is not available here (torch {torch.__version__},"
                             f" cuda {torch.version.cuda}); build on cpu or on a machine with a GPU")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.index >= torch.cuda.device_count():
            raise BuildError(f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def _weights_dict(cp, weights) -> dict:
    """build_executor's weights=: a dict of tensors (None for a plan without weights)."""
    if weights is None:
        weights = {}
    if not isinstance(weights, dict):
        raise BuildError(f"plan '{cp.plan.name}': weights= must be a dict {{name: tensor}}, got {type(weights).__name__}")
    for k, t in weights.items():
        if not isinstance(t, torch.Tensor):
            raise BuildError(f"weight '{k}' must be a tensor, got {type(t).__name__}")
    return weights


def _check_externs(cp, externs, needed) -> dict:
    plan = cp.plan
    if externs is not None and not isinstance(externs, Mapping):
        raise BuildError(f"plan '{plan.name}': externs= must be a dict {{fn name: callable}}, got"
                         f" {type(externs).__name__}")
    externs = dict(externs or {})
    unbound = [n for n in needed if n not in externs]
    if unbound:
        raise BuildError(f"plan '{plan.name}' calls extern(s) {unbound} but externs= binds {sorted(externs)};"
                         " pass callables for them (executors.tools.externs.default_externs(plan) gives test stand-ins)")
    # names the plan does not call are allowed: an engine may pass one registry of all its model code
    for n, fn in externs.items():
        if not callable(fn):
            raise BuildError(f"externs['{n}'] must be callable(*tensors), got {type(fn).__name__}")
    return externs


def _checked_args(cp, weights, prefs, device, prepack: bool, check_memory: bool):
    """build_executor's weights, backend_prefs and device, checked (BuildError), with each weight
    in the layout its kernel reads (the executor keeps only these: executors.weights)."""
    weights = _weights_dict(cp, weights)
    prefs = _check_prefs(prefs)
    device = resolve_device(device, weights)
    _check_weights(cp, weights, device)
    if check_memory:
        from .resources import check_build
        check_build(cp, device)
    return prepare_weights(cp, weights, device, prefs, prepack), prefs, device


def _check_prefs(prefs):
    if prefs is None:
        return None
    if isinstance(prefs, str) or not all(isinstance(b, str) for b in prefs):
        raise BuildError(f"backend_prefs= must be a list of backend names, got {prefs!r:.80}")
    known = backend_names()
    bad = [b for b in prefs if b not in known]
    if bad:
        raise BuildError(f"backend_prefs= names {bad}, which no op has; backends: {sorted(known)}")
    return tuple(prefs)


def _check_weights(cp, weights, device):
    plan = cp.plan
    missing = [w for w in plan.weights if w not in weights]
    extra = [w for w in weights if w not in plan.weights]
    if missing or extra:
        said = ([f"weights {missing} are missing"] if missing else []) + (
            [f"{extra} {'is not a weight' if len(extra) == 1 else 'are not weights'} of the plan"
             f" (its weights: {sorted(plan.weights) or 'none'})"] if extra else [])
        raise BuildError(f"plan '{plan.name}': " + "; ".join(said))
    for name in plan.weights:
        t, spec = weights[name], plan.tensors[name]
        if all(isinstance(d, int) for d in spec.shape) and tuple(t.shape) != tuple(spec.shape):
            raise BuildError(f"weight '{name}' has shape {tuple(t.shape)} but the plan declares {tuple(spec.shape)}")
        if t.dtype != torch_dtype(spec.dtype):
            raise BuildError(f"weight '{name}' is {t.dtype} but the plan declares {spec.dtype}")
        if t.device.type != device.type:
            raise BuildError(f"weight '{name}' is on {t.device} but the executor runs on {device}; move it first")


def build_executor(compiled, weights: dict, *, group=None, device=None, externs: dict | None = None,
                   backend_prefs=None, tuning: dict | str | None = None, trace: bool = False,
                   agree: bool = True, prepack: bool = True, check_memory: bool = True,
                   check_dims: bool | None = None) -> Executor:
    """Lower `compiled` (planner.graph.Compiled) to an Executor.

    group: a torch.distributed process group for every plan group, or {plan group: pg};
      None uses the default group when torch.distributed is initialized (size-1 groups need none).
    externs: {extern fn name: callable(*tensors) -> tensor}; every extern the plan uses must be bound
      (executors.tools.externs.default_externs gives deterministic stand-ins for test runs).
    backend_prefs: backend priority for ops with backend 'auto' (default: cute, p2p, torch; flashinfer on request).
    tuning: a tuning file (planner.tuning format) or its dict: limits for the gates (tuned.NAME)
      and measured gemm backends per M, lowered into the steps here; {name: int}: limits only;
      {}: none; None: the shipped tuning matching this device and plan (planner/tuned/), else the
      plan's defaults. ex.tuning_source says which applied.
    agree: all-gather the plan hash before anything runs when the plan has collectives.
    weights: {name: tensor}, or executors.weights.prepare_weights(...) output (taken as is).
      A plain dict goes through prepare_weights here: the first weight of a fused gemm chain
      (the KDA packed projection) takes the mma-fragment layout of the swapped-role kernel and
      the executor keeps only that tensor (ex.weight_layouts; ex.prepacked_bytes is {}).
    prepack: False keeps every weight row-major (the fused kernel then runs the non-swapped
      roles: 0.3-1.5 us slower per step on H200, run49). New weights: executors.weights.load_weights.
    check_memory: refuse (BuildError) when the plan's peak activations at the dims' upper bounds do not
      fit what the device has free (executors.resources.check_build).
    check_dims: before each call's collectives, all ranks agree on the call's dims (a debug switch;
      None reads env PLANNER_AGREE_DIMS; never inside a graph capture; executors.agreement).
    """
    cp = compiled
    plan = cp.plan
    if not cp.schedule:
        cp.schedule = default_schedule(cp)
    verify(cp)  # nothing runs that the planner cannot prove ordered (raises planner.verify.VerifyError)
    # an error in the arguments (weights, device, memory, model code) or the tuning, or one that
    # preparing the weights meets (out of device memory), is raised after the agreement, so a rank
    # that fails alone is named there instead of leaving the others waiting
    g = cp.graph
    tuning_data, tuning_source, problem = {}, "", None
    try:
        weights, backend_prefs, device = _checked_args(cp, weights, backend_prefs, device, prepack, check_memory)
        # the tuning in effect is resolved first so the agreement covers it
        tuning_data, tuning_source = resolve_tuning(cp, tuning, device)
        externs = _check_externs(cp, externs, sorted({g.nodes[v]["op"].fn for v in cp.schedule
                                                      if g.nodes[v]["op"].op == "extern"}))
    except Exception as exc:  # noqa: BLE001 - re-raised as it is once the ranks have heard of it
        problem = exc
    comms = bind_groups(plan.groups, group)
    has_coll = any(g.nodes[v]["op"].op in COLLECTIVES for v in cp.schedule)
    if agree and has_coll:
        # before anything can raise on one rank only
        prefs = None if problem is not None else backend_prefs
        what = "" if problem is None else str(problem) if isinstance(problem, BuildError) else \
            f"{type(problem).__name__}: {problem}"  # a MemoryError() says nothing by itself
        agree_on_plan(plan_description(cp, tuning_data, prefs, problem=what), comms)
    if problem is not None:
        raise problem
    check_group_sizes(comms)
    check_shared_groups(cp, comms, device)
    tuned = {**plan.tuned, **{k: int(v) for k, v in tuning_data.get("limits", {}).items()}}
    dev_weights = {k: weights[k] for k in plan.weights}
    bctx = _BuildCtx(cp, device, comms, externs, dev_weights, weights.layouts)
    steps = _lower_steps(cp, bctx, device, backend_prefs, tuning_data, weights.layouts)
    pieces = bucket_steps(cp, steps)
    events = {}
    if device.type == "cuda":
        with torch.cuda.device(device):
            # create the cuBLAS handle now: a first torch.mm inside someone's graph capture
            # (e.g. a variant only captures take) would try to create it there and fail
            torch.cuda.current_blas_handle()
            names = set(cp.events).union(*(set(p.events) for p in pieces))
            events = {e: torch.cuda.Event() for e in sorted(names)}
            events["entry"] = torch.cuda.Event()
    solver = DimSolver(plan, plan.inputs)
    ex = Executor(cp, steps, compile_regions(cp), solver, comms, device, dev_weights, tuned, events,
                  list(getattr(cp, "exit_waits", []) or []), trace, pieces=pieces)
    ex.tuning_source = tuning_source  # which tuning applied (a file, planner/tuned/..., or none and why)
    ex.weight_layouts = dict(weights.layouts)
    ex.prepacked_bytes = {}  # bytes kept beyond the weights: none (the prepared tensor is the only copy)
    ex.backends = {s.id: s.backend for s in steps}
    ex._op, ex._op_out, ex._op_spec = register_ops(ex)  # the torch.compile entry (executors.custom_op)
    from .agreement import dims_check_enabled
    ex.check_dims = has_coll and dims_check_enabled(check_dims)
    return ex


# ops whose result may be their input's memory at some sizes or bindings
MAY_RETURN_INPUT = {"shard", "all_gather", "all_reduce", "reduce_scatter", "extern"}


def overwritten(cp) -> set[str]:
    """Tensors an in-place op writes over, with each region output's per-variant values."""
    g = cp.graph
    names = set()
    for v in cp.schedule:
        names.update(written_in_place(g.nodes[v]["op"]))
    todo = list(names)
    while todo:
        p = cp.tensors[todo.pop()].producer
        op = g.nodes[p]["op"] if p in g else None
        if op is not None and op.op == "select":
            new = set(op.choices) - names
            names |= new
            todo += new
    return names


def _copy_if_shared(run):
    """run, with a result that is an input's memory copied (executors.overlap.unshared)."""
    def go(ins, b, out):
        r = run(ins, b, out)
        return r if out is not None else unshared(r, ins)
    return go


def _lower_steps(cp, bctx, device, prefs, tuning=None, layouts=None) -> list[Step]:
    g = cp.graph
    table, keyed = gemm_table(tuning or {}), keyed_table(tuning or {})
    written = overwritten(cp)
    steps = []
    for v in cp.schedule:
        d = g.nodes[v]
        op = d["op"]
        st = Step()
        st.id, st.kind = v, op.op
        st.ins, st.outs = tuple(op.inputs()), tuple(op.out)
        st.guard = tuple(tuple(x) for x in d.get("ctx", ()))
        st.slot = st.packed_out = st.select = None
        st.backend = None
        slot = d.get("out_slot")
        if slot is not None:
            if op.op in VIEW_KINDS:
                raise BuildError(f"op '{v}' ({op.op}) is a view and cannot write into a packed slot")
            name, dim, off, size = slot
            st.slot = (name, dim, dim_fn(off, bctx.params), dim_fn(size, bctx.params))
        if op.op == "cat" and op.inplace:
            st.packed_out = op.out[0]
            for m in op.inplace:
                p = cp.tensors[m].producer
                ms = g.nodes[p].get("out_slot") if p in g else None
                if ms is None or ms[0] != op.out[0]:
                    raise BuildError(f"cat '{v}' lists '{m}' as written in place, but its producer does not"
                                     f" write into '{op.out[0]}' (out_slot={ms})")
        if op.op == "select":
            variants = list(op.variants) or [x.name for x in cp.plan.regions[op.region].variants]
            st.select = (op.region, dict(zip(variants, op.choices, strict=True)))
            st.run = None
        else:
            specs = [cp.tensors[n] for n in op.inputs()]
            impl = lookup(op, specs, device.type, prefs, bctx._comms)
            st.run = impl.make(op, bctx)
            st.backend = impl.backend
            lay = layout_of_tensor(cp, op.b, layouts) if op.op == "gemm" and layouts else ROW
            if lay != ROW:  # the weight operand is a prepared layout: its own runner, no tuning
                st.run, st.backend = layout_gemm(lay, device)
            else:  # measured backend per M (planner tune), chosen here once
                got = tuned_keyed(op, specs, bctx.params, bctx.dims, keyed, st.run, bctx)
                if got is None and op.op == "gemm":
                    got = tuned_gemm(op, specs[0], specs[1], bctx.params, table, st.run, device.type)
                if got is None and op.op == "all_reduce_add_rmsnorm":  # the tuned fused-kernel limit
                    got = tuned_allreduce_norm(op, bctx, tuning or {})
                if got is not None:
                    st.run, st.backend = got
            if op.op in MAY_RETURN_INPUT and written & set(op.out):  # an in-place write must not reach an input
                st.run = _copy_if_shared(st.run)
        steps.append(st)
    _stream_fields(cp, steps)
    return steps


def _stream_fields(cp, steps) -> None:
    """In place: each step's stream, waits, records and the streams its results are used on
    (record_stream), from cp's assignment and events."""
    g = cp.graph
    consumers: dict[str, set] = {}
    for v in cp.schedule:
        for n in g.nodes[v]["op"].inputs():
            consumers.setdefault(n, set()).add(g.nodes[v]["stream"])
    outputs = set(cp.plan.outputs)
    for st in steps:
        d = g.nodes[st.id]
        op = d["op"]
        st.stream = d.get("stream") or MAIN
        st.waits = tuple(d.get("waits") or ())
        st.records = tuple(d.get("records") or ())
        # streams that read what this op makes (through views too) + main, for record_stream
        rs = set()
        for n in op.out:
            rs |= consumers.get(n, set())
            for t, spec in cp.tensors.items():
                if spec.alias_of == n:
                    rs |= consumers.get(t, set())
        if st.stream != MAIN:
            rs.add(MAIN)
        rs.discard(st.stream)
        st.rs_streams = tuple(sorted(rs))
        if op.op != "select" and set(op.out) & outputs and st.stream != MAIN:
            st.rs_streams = tuple(sorted(set(st.rs_streams) | {MAIN}))


class BucketSteps(NamedTuple):
    """One range of a dim and what a call in it runs (planner/passes/bucket_plans.py)."""
    dim: str
    lo: int
    hi: int
    steps: list
    exit_waits: list
    events: dict  # the range's events: {id: {"op", "stream"}}


def bucket_steps(cp, steps) -> list[BucketSteps]:
    """The plan's per-range stream plans: the same lowered ops, with each range's streams and
    events; [] when one plan serves every size."""
    import copy
    out = []
    by_id = {st.id: st for st in steps}
    for p in cp.bucket_plans:
        own = p.get("cp")
        if own is None:
            out.append(BucketSteps(p["dim"], p["lo"], p["hi"], steps, list(cp.exit_waits), cp.events))
            continue
        mine = [copy.copy(by_id[v]) for v in own.schedule]
        _stream_fields(own, mine)
        out.append(BucketSteps(p["dim"], p["lo"], p["hi"], mine, list(own.exit_waits), own.events))
    return out
