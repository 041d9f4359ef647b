"""The call of a lowered plan: Executor(**inputs) walks the schedule once.

A call skips ops whose variant did not win, waits on the op's events, runs it on its
stream, records its events, and joins at the end.

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

import torch

from planner.expr import unparse
from planner.predicates import Facts

from .custom_op import check_out, compiled_call, describe, dims_arg, write_outputs
from .dims import DimError, shape_fn
from .dtypes import torch_dtype
from .errors import InputError
from .gating import GateTensors, is_capturing
from .overlap import storage_key
from .streams import MAIN, side_stream

__all__ = ["Executor", "Step"]


class Step:
    """One lowered op: what runs, on which stream, with which events."""

    __slots__ = ("id", "kind", "run", "ins", "outs", "guard", "stream", "waits", "records", "slot",
                 "packed_out", "select", "rs_streams", "backend")


def refuse_positional(plan, args: tuple) -> None:
    """An executor's call takes its inputs by name (ex(x, r) would read x as dims=)."""
    if args:
        raise InputError(f"plan '{plan.name}' takes its inputs by name, ex({', '.join(f'{n}=...' for n in plan.inputs)});"
                         f" got {len(args)} positional argument(s)")


class Executor:
    """Callable: executor(**inputs, dims=None) -> {output name: tensor}."""

    check_dims = False  # build_executor(check_dims=True) / PLANNER_AGREE_DIMS=1: ranks agree on each call's dims

    def __init__(self, cp, steps, gates, solver, comms, device, weights, tuned, events, exit_waits, trace,
                 pieces=()):
        self.compiled = cp
        self.plan = cp.plan
        self._steps = steps
        self._gates = gates
        self._by_depth = sorted(gates, key=lambda r: len(cp.plan.regions[r].within))  # outer regions first
        self._solver = solver
        self._comms = comms
        self.device = device
        self._weights = weights
        # {storage: [weight names]}: load_weights writes in place, so these addresses stay
        self._weight_storage: dict[tuple, list[str]] = {}
        for n, t in weights.items():
            if t.numel():
                self._weight_storage.setdefault(storage_key(t), []).append(n)
        self.tuned = tuned
        self._events = events
        self._exit_waits = exit_waits
        self._cuda = device.type == "cuda"
        self._specs = cp.tensors
        self._packed_shape = {}
        self.last_variants: dict[str, str] = {}
        self.forced: dict[str, str] = {}  # region -> variant taken regardless of its gate (checks)
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
        self._checks = _input_checks(cp.plan, device)
        # the torch custom ops of this executor (executors.custom_op.register_ops, from build_executor)
        self._op = self._op_out = self._op_spec = None
        self.op_layout_copies = 0
        # the guards of each event's recording op: a wait whose event was not recorded in this
        # call is skipped only when its recorder was a variant that did not run (derive-events
        # waits on every variant's producer of a region output); anything else is a planner bug
        g = cp.graph
        self._rec_guard = {e: tuple(tuple(x) for x in g.nodes[i["op"]]["ctx"])
                           for evs in [cp.events] + [p.events for p in pieces] for e, i in evs.items() if i.get("op") in g}
        # per-range stream plans (planner/passes/bucket_plans.py), executors.lowering.BucketSteps
        self._pieces = list(pieces)
        self.forced_piece: int | None = None  # a range run regardless of the call's dims (checks)
        self.last_piece: int | None = None

    def __copy__(self):
        return self.__deepcopy__({})

    def __deepcopy__(self, memo):
        # a copy would share this executor's torch op (torch.compile would run these weights),
        # its kernels' workspaces and its communicators: build another one instead
        raise TypeError(f"an executor of plan '{self.plan.name}' cannot be copied: it owns its torch op,"
                        " device buffers and communicators; build one per model copy with"
                        " build_executor(executor.compiled, weights, ...) (executors built from the same"
                        " tensors share them, and load_weights into one loads all of them: build a copy that"
                        " loads its own weights from tensors of its own)")

    def __reduce_ex__(self, protocol):
        raise TypeError(f"an executor of plan '{self.plan.name}' cannot be pickled: it holds device buffers,"
                        " kernels and communicators; save the plan and the weights, and rebuild it with"
                        " build_executor")

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

    def __call__(self, *args, dims: dict | None = None, _facts: Facts | None = None, out: dict | None = None,
                 **inputs):
        refuse_positional(self.plan, args)
        if torch.compiler.is_compiling():
            # under Dynamo the call is one opaque custom op (executors.custom_op): streams, events
            # and gates run inside it at run time, the fake kernel gives the traced shapes
            return compiled_call(self, inputs, dims, out)
        dims = dims_arg(self, dims)
        b = self._check_inputs(inputs, dims)
        if out is not None:
            check_out(self, out, b, inputs)
            return write_outputs(self, self._run(inputs, dims, _facts), out)
        return self._run(inputs, dims, _facts)

    def check_inputs(self, inputs: dict, dims: dict | None = None) -> dict:
        """Check a call's inputs against the plan (names, types, dtypes, devices, ranks, declared
        contiguity, sizes in the declared dims); returns the dim bindings. Raises InputError naming
        the input and what the plan expects; nothing has run and the executor stays usable."""
        return self._check_inputs(inputs, dims_arg(self, dims))

    def _check_inputs(self, inputs: dict, dims: dict | None) -> dict:
        """check_inputs with dims= already checked by dims_arg."""
        checks = self._checks
        if len(inputs) != len(checks) or any(n not in inputs for n in checks):
            missing = [n for n in checks if n not in inputs]
            extra = [n for n in inputs if n not in checks]
            raise InputError(f"plan '{self.plan.name}' takes inputs {list(checks)}; missing {missing}, unexpected {extra}")
        for name, (dt, dev, nd, contig, what) in checks.items():
            t = inputs[name]
            if not isinstance(t, torch.Tensor):
                raise InputError(f"plan '{self.plan.name}': input '{name}' must be a tensor {what}, got {type(t).__name__}")
            if t.dtype != dt or t.device != dev or t.dim() != nd or (contig and not t.is_contiguous()):
                raise InputError(f"plan '{self.plan.name}': input '{name}' must be {what}; got {describe(t)}")
        try:
            return self._solver.solve(inputs, dims)
        except DimError as exc:
            raise InputError(f"plan '{self.plan.name}': {exc}") from None

    def _run(self, inputs: dict, dims: dict | None = None, _facts: Facts | None = None, keep=()) -> dict:
        env = dict(self._weights)
        env.update(inputs)
        facts = _facts or self.facts(inputs, dims, env)
        facts.tensors = GateTensors(env, self._specs, facts.dims)
        b = facts.dims
        if self.check_dims and not facts.capturing:
            from .agreement import agree_on_dims
            agree_on_dims(self.plan.name, b, self._comms)
        gates = self._gates
        steps, exit_waits = self._steps, self._exit_waits
        if self._pieces:
            i = self.forced_piece if self.forced_piece is not None else self.piece_of(b)
            steps, exit_waits = self._pieces[i].steps, self._pieces[i].exit_waits
            self.last_piece = i
        chosen: dict[str, str] = dict(self.forced)
        cuda = self._cuda
        tracing = self._tracing
        recs = [] if tracing else None
        recorded = {"entry"}
        if cuda:
            main = torch.cuda.current_stream(self.device)
            capturing = facts.capturing
            started: dict[str, object] = {}
            ev = self._events
            ev["entry"].record(main)
        for st in steps:
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
                for w in st.waits:  # the same bookkeeping as on a GPU, so CPU runs prove it too
                    if w not in recorded:
                        self._unrecorded(st.id, w, chosen)
                t0 = time.perf_counter() if tracing else 0.0
                res = st.run(ins, b, out)
                if tracing:
                    recs.append((st, t0, time.perf_counter()))
                recorded.update(st.records)
            else:
                s = main if st.stream == MAIN else side_stream(st.stream, self.device)
                if s is not main and st.stream not in started:
                    started[st.stream] = st
                    if not any(w in recorded for w in st.waits):
                        s.wait_event(ev["entry"])
                for w in st.waits:
                    if w in recorded:
                        s.wait_event(ev[w])
                    else:
                        self._unrecorded(st.id, w, chosen)
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
        for e in exit_waits:
            if e not in recorded:
                self._unrecorded("exit", e, chosen)
        if cuda:
            self._join(main, started, recorded, exit_waits)
        if len(chosen) < len(gates) or self.forced:
            # a region none of whose steps this path met (all pruned, or every op of it dead code)
            # still reports the variant its gate picks, when the variants it sits in ran; a forced
            # variant inside a variant that did not run is not reported as run
            for r in self._by_depth:
                inside_ran = all(chosen.get(o) == v for o, v in self.plan.regions[r].within)
                if r not in chosen and inside_ran:
                    chosen[r] = gates[r].choose(facts)
                elif r in chosen and not inside_ran:
                    del chosen[r]
        self.last_variants = chosen
        # keep no tensor of the call alive past it (not even its inputs: in a compiled model they
        # can be intermediates of the caller's graph): under cudagraph trees every live allocation
        # of the graph pool must be an output
        facts.tensors = GateTensors({}, self._specs, facts.dims)
        self.last_facts = facts
        if tracing:
            self.last_trace = self._trace_records(recs)
        res = {n: env[n] for n in self._outputs}
        for n in keep:  # buffers the custom op returns (executors.custom_op), when this call made them
            if n in env:
                res[n] = env[n]
        return res

    # ------------------------------------------------------------ helpers of the call

    def _unrecorded(self, where: str, e: str, chosen: dict) -> None:
        """A wait on an event not recorded in this call: fine when its recorder's variant did not run."""
        guard = self._rec_guard.get(e)
        if guard is None or all(chosen.get(r) == v for r, v in guard):
            raise RuntimeError(f"internal error: '{where}' waits on event {e}, which this call did not record"
                               f" although {'its recorder ran' if guard is not None else 'nothing records it'}"
                               f" (variants {chosen}); the wait would be a no-op on the GPU and the read a race")

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

    def piece_of(self, b: dict) -> int:
        """The per-range stream plan a call with dims `b` runs."""
        for i, p in enumerate(self._pieces):
            if p.lo <= b[p.dim] <= p.hi:
                return i
        d = self._pieces[0].dim
        raise RuntimeError(f"internal error: {d}={b[d]} is in no stream plan's range")

    def every_step(self) -> list:
        """The lowered steps of the plan and of every per-range stream plan (each object once)."""
        seen, out = set(), []
        for steps in [self._steps] + [p.steps for p in self._pieces]:
            for st in steps:
                if id(st) not in seen:
                    seen.add(id(st))
                    out.append(st)
        return out

    @property
    def pieces(self) -> list[tuple]:
        """[(dim, lo, hi)] of the per-range stream plans ([] when one plan serves every size)."""
        return [(p.dim, p.lo, p.hi) for p in self._pieces]

    def _join(self, main, started, recorded, exit_waits):
        ev = self._events
        for e in exit_waits:
            if e in recorded:
                main.wait_event(ev[e])
        # any side stream whose last op this call is not covered by an exit wait joins here too,
        # so the main stream (and a capture) never returns with work forked and unjoined
        for name, st in started.items():
            if name == MAIN or any(e in exit_waits for e in st.records):
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


def _input_checks(plan, device) -> dict:
    """{input: (dtype, device, rank, contiguous declared, description)}, made once at build."""
    out = {}
    for name in plan.inputs:
        spec = plan.tensors[name]
        contig = bool(spec.meta.get("contiguous"))
        dims = ", ".join(str(d) if isinstance(d, int) else unparse(d) for d in spec.shape)
        what = f"{spec.dtype}[{dims}]{' contiguous' if contig else ''} on {device}"
        out[name] = (torch_dtype(spec.dtype), device, len(spec.shape), contig, what)
    return out
