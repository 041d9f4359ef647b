"""Which readers cannot take a fused collective's tensors as views (used by fuse-collectives).

Packing turns a member's input into a slot of the packed buffer (when its producer writes in
place) and its result into a piece of the packed result: views of one buffer, strided unless
they are cut along dim 0. Some readers cannot take such a view: a view needs a contiguous input,
an in-place norm a buffer of its own, a gate that asks contiguous(t) would pick another
variant than the plan as written, and model code was written for the whole tensor the plan
gives it (it may view or hand it to a kernel that needs it contiguous). They are found by inferring the readers again (through
split, slice and select, whose results are views of what they read) with the tensor as the view
it would become: what fails there would fail verification, or at run time, after the rewrite.
"""

from __future__ import annotations

import dataclasses
from collections import ChainMap

from ..expr import Bin, Call, Expr, Name, Unary
from ..infer import InferCtx
from ..ops import VIEW_OPS

__all__ = ["Readers"]

PACKED = "the packed buffer"  # what a probed tensor is a view of


def _contiguous_args(e: Expr | None):
    if isinstance(e, Call):
        if e.fn == "contiguous" and e.args and isinstance(e.args[0], Name):
            yield e.args[0].id
        for a in e.args:
            yield from _contiguous_args(a)
    elif isinstance(e, Unary):
        yield from _contiguous_args(e.x)
    elif isinstance(e, Bin):
        yield from _contiguous_args(e.l)
        yield from _contiguous_args(e.r)


class Readers:
    """The plan's readers of each tensor and the gates that ask contiguous() of one."""

    def __init__(self, cp):
        self.cp = cp
        self.of: dict[str, list[str]] = {}
        for v, d in cp.graph.nodes(data=True):
            for t in dict.fromkeys(d["op"].inputs()):
                self.of.setdefault(t, []).append(v)
        self.gates: dict[str, str] = {}
        live = cp.variants or {}
        for rid, region in cp.plan.regions.items():
            for var in live.get(rid) or region.variants:
                for t in _contiguous_args(var.when):
                    self.gates.setdefault(t, f"the gate of variant '{var.name}' of region '{rid}'")

    def trouble(self, name: str, strided: bool, skip=()) -> tuple[str, str] | None:
        """Why `name` cannot become a view of the packed buffer (strided or not), as (kind, text):
        kind "view" when a view op needs it contiguous, "contiguous" for another reader or a gate
        that does, "own" for a reader that needs a buffer of its own; None when every reader,
        except the ops in `skip`, takes the view."""
        hit = self._walk(name, False, skip)  # a view at all
        if hit is None and strided:
            hit = self._walk(name, True, skip)
        return hit

    def _walk(self, name: str, strided: bool, skip):
        cp, plan = self.cp, self.cp.plan
        base = cp.tensors[name]
        over = {name: dataclasses.replace(base, contiguous=base.contiguous and not strided, alias_of=PACKED)}
        ctx = InferCtx(ChainMap(over, cp.tensors), plan.params, plan.dims, plan.groups, cp.probes)
        todo = [name]
        while todo:
            t = todo.pop(0)
            if strided and t in self.gates and not over[t].contiguous:
                return "contiguous", f"{self.gates[t]} asks contiguous({t})"
            for r in self.of.get(t, ()):
                if r in skip:
                    continue
                op = cp.graph.nodes[r]["op"]
                if op.op == "extern" and not over[t].contiguous:  # model code got it whole as written
                    return "contiguous", f"model code '{r}' ({op.fn}) is given '{t}', as written a whole tensor"
                ctx.op = op
                try:
                    specs = op.infer(ctx)
                except Exception:  # noqa: BLE001 - any failure: this reader cannot take the view
                    if not strided:
                        return "own", f"{op.op} '{r}' cannot take '{t}' as a view of the packed buffer"
                    return ("view" if op.op == "view" else "contiguous"), f"{op.op} '{r}' needs '{t}' contiguous"
                if op.op not in VIEW_OPS:
                    continue
                for s in specs:  # a view of the probed tensor: its readers read the packed buffer too
                    rec = cp.tensors.get(s.name)
                    if s.name not in over and (rec is None or (s.contiguous, s.alias_of) != (rec.contiguous, rec.alias_of)):
                        over[s.name] = s
                        todo.append(s.name)
        return None
