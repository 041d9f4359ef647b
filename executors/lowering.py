"""Lower a compiled plan to a callable: build_executor(compiled, weights, ...) -> Executor.

Build time does everything that does not depend on the call: pick an implementation
per op through the registry, fold symbolic attributes, compile gates, bind plan
groups to process groups (and agree on the plan hash), create one event per site.
A call then walks the schedule once: skip ops whose variant did not win, wait on
the op's events, run it on its stream, record its events, and join at the end.

Streams: "main" is the caller's current stream; any other name is the one shared
side stream of that name (executors.streams). Lifetimes across streams: buffers are
allocated on the main stream before a side-stream op is entered; tensors allocated
by a side-stream op get record_stream() for the streams that consume them (and the
main stream) outside graph capture, so the caching allocator cannot hand their
memory out before those streams are done. Under capture the graph's private pool
keeps them alive, and record_stream is skipped (as TensorRT-LLM does).
"""

from __future__ import annotations

import contextlib
import time

import networkx as nx
import torch

from planner.predicates import Facts

from .collectives import agree_on_plan, bind_groups, check_group_sizes, plan_hash
from .dims import DimSolver, dim_fn, shape_fn
from .gating import GateTensors, compile_regions, is_capturing
from .registry import lookup
from .streams import MAIN, side_stream
from .torch_ops import torch_dtype

__all__ = ["build_executor", "Executor", "BuildError", "default_schedule"]

VIEW_KINDS = {"split", "slice", "view", "select"}


class BuildError(ValueError):
    """The compiled plan cannot be lowered with the given weights, groups or externs."""


def default_schedule(cp) -> list[str]:
    """Plan order made topological: the schedule when no planner pass set one."""
    order = {op.id: i for i, op in enumerate(cp.plan.ops)}
    return list(nx.lexicographical_topological_sort(cp.graph, key=lambda v: order.get(v, 0)))


class _BuildCtx:
    def __init__(self, cp, device, comms, externs):
        self.params = cp.plan.params
        self.dims = cp.plan.dims
        self.specs = cp.tensors
        self.device = device
        self._comms = comms
        self._externs = externs

    def comm(self, group: str):
        return self._comms[group]

    def extern(self, name: str):
        return self._externs[name]


class _Step:
    __slots__ = ("id", "kind", "run", "ins", "outs", "guard", "stream", "waits", "records", "slot",
                 "packed_out", "select", "rs_streams", "backend")


class Executor:
    """Callable: executor(**inputs, dims=None) -> {output name: tensor}."""

    def __init__(self, cp, steps, gates, solver, comms, device, weights, tuned, events, exit_waits, trace):
        self.compiled = cp
        self.plan = cp.plan
        self._steps = steps
        self._gates = gates
        self._solver = solver
        self._comms = comms
        self.device = device
        self._weights = weights
        self.tuned = tuned
        self._events = events
        self._exit_waits = exit_waits
        self._cuda = device.type == "cuda"
        self._specs = cp.tensors
        self._packed_shape = {}
        self.last_variants: dict[str, str] = {}
        self.last_facts: Facts | None = None
        self._tracing = trace
        self.last_trace: list[dict] = []
        self._inputs = list(cp.plan.inputs)
        self._outputs = list(cp.plan.outputs)
        self.rank = next((c.rank for c in comms.values() if c.pg is not None), 0)
        self.world_size = torch.distributed.get_world_size() if torch.distributed.is_available() and torch.distributed.is_initialized() else 1
        self.cc = 0
        if self._cuda:
            major, minor = torch.cuda.get_device_capability(device)
            self.cc = major * 10 + minor
        self.backends = {s.id: s.backend for s in steps}

    # ------------------------------------------------------------ facts and variants

    def facts(self, inputs: dict, dims: dict | None = None, env: dict | None = None, capturing: bool | None = None) -> Facts:
        b = self._solver.solve(inputs, dims)
        return Facts(dims=b, capturing=is_capturing(self._cuda) if capturing is None else capturing, cc=self.cc,
                     device=self.device.type, rank=self.rank, world_size=self.world_size, tuned=self.tuned,
                     tensors=GateTensors(env if env is not None else inputs, self._specs, b))

    def choose(self, facts: Facts) -> dict[str, str]:
        """Every region's variant under `facts` (what a call with these facts would run)."""
        return {r: g.choose(facts) for r, g in self._gates.items()}

    @contextlib.contextmanager
    def trace(self):
        """Record per-op start/end times per stream for the calls inside; read .last_trace after."""
        old = self._tracing
        self._tracing = True
        try:
            yield self
        finally:
            self._tracing = old

    # ------------------------------------------------------------ the call

    def __call__(self, dims: dict | None = None, _facts: Facts | None = None, **inputs):
        if len(inputs) != len(self._inputs) or any(n not in inputs for n in self._inputs):
            missing = [n for n in self._inputs if n not in inputs]
            extra = [n for n in inputs if n not in self._inputs]
            raise TypeError(f"plan '{self.plan.name}' takes inputs {self._inputs}; missing {missing}, unexpected {extra}")
        env = dict(self._weights)
        env.update(inputs)
        facts = _facts or self.facts(inputs, dims, env)
        facts.tensors = GateTensors(env, self._specs, facts.dims)
        b = facts.dims
        gates = self._gates
        chosen: dict[str, str] = {}
        cuda = self._cuda
        tracing = self._tracing
        recs = [] if tracing else None
        if cuda:
            main = torch.cuda.current_stream(self.device)
            capturing = facts.capturing
            recorded = set()
            started: dict[str, object] = {}
            ev = self._events
            if "entry" in ev:
                ev["entry"].record(main)
                recorded.add("entry")
        for st in self._steps:
            if st.guard:
                skip = False
                for r, v in st.guard:
                    c = chosen.get(r)
                    if c is None:
                        c = chosen[r] = gates[r].choose(facts)
                    if c != v:
                        skip = True
                        break
                if skip:
                    continue
            if st.select is not None:
                r, choices = st.select
                c = chosen.get(r)
                if c is None:
                    c = chosen[r] = gates[r].choose(facts)
                env[st.outs[0]] = env[choices[c]]
                continue
            out = None
            if st.slot is not None:
                out = self._slot(st.slot, env, b)
            elif st.packed_out is not None:
                out = self._packed(st.packed_out, env, b)
            ins = [env[n] for n in st.ins]
            if not cuda:
                t0 = time.perf_counter() if tracing else 0.0
                res = st.run(ins, b, out)
                if tracing:
                    recs.append((st, t0, time.perf_counter()))
            else:
                s = main if st.stream == MAIN else side_stream(st.stream, self.device)
                if s is not main and st.stream not in started:
                    started[st.stream] = st
                    if not any(w in recorded for w in st.waits):
                        s.wait_event(ev["entry"] if "entry" in recorded else self._entry(main, recorded))
                for w in st.waits:
                    if w in recorded:
                        s.wait_event(ev[w])
                res = self._run_on(st, s, main, ins, b, out, tracing, recs)
                for e in st.records:
                    ev[e].record(s)
                    recorded.add(e)
                if s is not main and not capturing:
                    for t in (res if isinstance(res, list) else (res,)):
                        for name in st.rs_streams:
                            t.record_stream(main if name == MAIN else side_stream(name, self.device))
                started[st.stream] = st
            if isinstance(res, list):
                for n, t in zip(st.outs, res, strict=True):
                    env[n] = t
            else:
                if out is not None and res is not out and st.slot is not None:
                    out.copy_(res)
                    res = out
                env[st.outs[0]] = res
        if cuda:
            self._join(main, started, recorded)
        self.last_variants = chosen
        self.last_facts = facts
        if tracing:
            self.last_trace = self._trace_records(recs)
        return {n: env[n] for n in self._outputs}

    # ------------------------------------------------------------ helpers of the call

    def _entry(self, main, recorded):
        ev = self._events.setdefault("entry", torch.cuda.Event())
        ev.record(main)
        recorded.add("entry")
        return ev

    def _run_on(self, st, s, main, ins, b, out, tracing, recs):
        if tracing:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(s)
        if s is main:
            res = st.run(ins, b, out)
        else:
            with torch.cuda.stream(s):
                res = st.run(ins, b, out)
        if tracing:
            e1.record(s)
            recs.append((st, e0, e1))
        return res

    def _join(self, main, started, recorded):
        ev = self._events
        for e in self._exit_waits:
            if e in recorded:
                main.wait_event(ev[e])
        # any side stream whose last op this call is not covered by an exit wait joins here too,
        # so the main stream (and a capture) never returns with work forked and unjoined
        for name, st in started.items():
            if name == MAIN or any(e in self._exit_waits for e in st.records):
                continue
            tail = ev.setdefault(f"tail:{name}", torch.cuda.Event())
            tail.record(side_stream(name, self.device))
            main.wait_event(tail)

    def _packed(self, name, env, b):
        t = env.get(name)
        if t is None:
            spec = self._specs[name]
            fn = self._packed_shape.get(name)
            if fn is None:
                fn = self._packed_shape[name] = shape_fn(spec.shape, self.plan.params)
            t = env[name] = torch.empty(fn(b), dtype=torch_dtype(spec.dtype), device=self.device)
        return t

    def _slot(self, slot, env, b):
        name, dim, off, size = slot
        return self._packed(name, env, b).narrow(dim, off(b), size(b))

    def _trace_records(self, recs) -> list[dict]:
        if not recs:
            return []
        out = []
        if self._cuda:
            torch.cuda.synchronize(self.device)
            base = recs[0][1]
            for st, e0, e1 in recs:
                out.append({"stream": st.stream, "op": st.id, "kind": st.kind,
                            "start_us": base.elapsed_time(e0) * 1e3, "end_us": base.elapsed_time(e1) * 1e3})
            t0 = min(r["start_us"] for r in out)
            for r in out:
                r["start_us"] -= t0
                r["end_us"] -= t0
        else:
            base = recs[0][1]
            for st, t0, t1 in recs:
                out.append({"stream": st.stream, "op": st.id, "kind": st.kind,
                            "start_us": (t0 - base) * 1e6, "end_us": (t1 - base) * 1e6})
        return out


def _resolve_device(device, weights) -> torch.device:
    if device is None:
        w = next(iter(weights.values()), None)
        device = w.device if w is not None else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _check_weights(cp, weights, device):
    plan = cp.plan
    missing = [w for w in plan.weights if w not in weights]
    extra = [w for w in weights if w not in plan.weights]
    if missing or extra:
        raise BuildError(f"plan '{plan.name}' needs weights {missing} (missing); unexpected {extra}")
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
                   agree: bool = True, prepack: bool = True) -> Executor:
    """Lower `compiled` (planner.graph.Compiled) to an Executor.

    group: a torch.distributed process group for every plan group, or {plan group: pg};
      None uses the default group when torch.distributed is initialized (size-1 groups need none).
    externs: {extern fn name: callable(*tensors) -> tensor}; every extern the plan uses must be bound
      (executors.externs.default_externs gives deterministic stand-ins for test runs).
    backend_prefs: backend priority for ops with backend 'auto' (default: cute, p2p, torch; flashinfer on request).
    tuning: {name: int} or a JSON file overriding plan.tuned (the limits gates read as tuned.NAME).
    agree: all-gather the plan hash before anything runs when the plan has collectives.
    prepack: a fused gemm chain (the KDA packed projection) may keep its first weight a second
      time in the mma-fragment layout of the swapped-role kernel; the bytes are in
      ex.prepacked_bytes ({weight: bytes}). False keeps no copy (the kernel then runs the
      non-swapped roles: 0.3-1.5 us slower per step on H200, run49). The copy is remade when the
      weight is written in place; a CUDA graph captured by hand keeps replaying the copy it
      captured, so re-capture after such a write (GraphedExecutor does that itself).
    """
    cp = compiled
    plan = cp.plan
    if not cp.schedule:
        cp.schedule = default_schedule(cp)
    device = _resolve_device(device, weights)
    _check_weights(cp, weights, device)
    comms = bind_groups(plan.groups, group)
    g = cp.graph
    has_coll = any(g.nodes[v]["op"].op in ("all_gather", "reduce_scatter", "all_reduce") for v in cp.schedule)
    if agree and has_coll:
        agree_on_plan(plan_hash(cp), comms)  # before anything can raise on one rank only
    check_group_sizes(comms)
    externs = dict(externs or {})
    needed = sorted({g.nodes[v]["op"].fn for v in cp.schedule if g.nodes[v]["op"].op == "extern"})
    unbound = [n for n in needed if n not in externs]
    if unbound:
        raise BuildError(f"plan '{plan.name}' calls extern(s) {unbound} but externs= binds {sorted(externs)};"
                         " pass callables for them (executors.externs.default_externs(plan) gives test stand-ins)")
    tuned = dict(plan.tuned)
    if isinstance(tuning, str):
        import json
        with open(tuning) as f:
            tuning = json.load(f)
    tuning_file = tuning if isinstance(tuning, dict) and "limits" in tuning else None
    if tuning_file is not None:  # the `planner tune` file: {"limits", "backends", "measured", ...}
        tuning = {k: v for k, v in tuning_file["limits"].items() if k in tuned}
    for k, v in (tuning or {}).items():
        if k not in tuned:
            raise BuildError(f"tuning sets '{k}' but the plan declares tuned limits {sorted(tuned)}")
        tuned[k] = int(v)
    bctx = _BuildCtx(cp, device, comms, externs)
    steps = _lower_steps(cp, bctx, device, backend_prefs)
    events = {}
    if device.type == "cuda":
        with torch.cuda.device(device):
            # create the cuBLAS handle now: a first torch.mm inside someone's graph capture
            # (e.g. a variant only captures take) would try to create it there and fail
            torch.cuda.current_blas_handle()
            events = {e: torch.cuda.Event() for e in cp.events}
            events["entry"] = torch.cuda.Event()
    solver = DimSolver(plan, plan.inputs)
    dev_weights = {k: weights[k] for k in plan.weights}
    ex = Executor(cp, steps, compile_regions(cp), solver, comms, device, dev_weights, tuned, events,
                  list(getattr(cp, "exit_waits", []) or []), trace)
    if tuning_file is not None and tuning_file.get("backends"):
        from .tune import apply_tuning
        apply_tuning(ex, tuning_file)  # measured backend/config per gemm signature and M
    from .gemm_chain import fuse_gemm_chains
    ex.prepacked_bytes = {}
    # one-launch gemm -> slice -> gemm
    fuse_gemm_chains(cp, steps, dev_weights, device, backend_prefs, ex.prepacked_bytes if prepack else None)
    ex.backends = {s.id: s.backend for s in steps}
    return ex


def _lower_steps(cp, bctx, device, prefs) -> list[_Step]:
    g = cp.graph
    consumers: dict[str, set] = {}
    for v in cp.schedule:
        for n in g.nodes[v]["op"].inputs():
            consumers.setdefault(n, set()).add(g.nodes[v]["stream"])
    outputs = set(cp.plan.outputs)
    steps = []
    for v in cp.schedule:
        d = g.nodes[v]
        op = d["op"]
        st = _Step()
        st.id, st.kind = v, op.op
        st.ins, st.outs = tuple(op.inputs()), tuple(op.out)
        st.guard = tuple(tuple(x) for x in d.get("ctx", ()))
        st.stream = d.get("stream") or MAIN
        st.waits = tuple(d.get("waits") or ())
        st.records = tuple(d.get("records") or ())
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
            impl = lookup(op, specs, device.type, prefs)
            st.run = impl.make(op, bctx)
            st.backend = impl.backend
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
        steps.append(st)
    return steps
