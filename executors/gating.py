"""Run-time variant choice: gates compiled once, evaluated per call against Facts.

A region's variants are tried in order; the first whose gate holds runs, the last
(no `when`) is the fallback. Gates are closures from planner.predicates (no eval),
folded against params at load time, so a call costs a few attribute reads.

A gate may ask about a tensor the plan computes before the region (contiguous(x7)
where x7 comes from an extern). The choice is made when the schedule first reaches
one of the region's ops, and the schedule may reach a weight slice before x7 is
computed; such a tensor is then answered from its TensorSpec (dtype, declared
contiguity, shape at this call's dims), which is the same on every rank.
"""

from __future__ import annotations

import torch

from planner.expr import eval_int
from planner.predicates import compile_gate

from .dtypes import torch_dtype

__all__ = ["RegionGate", "compile_regions", "GateTensors", "is_capturing"]


class RegionGate:
    __slots__ = ("region", "names", "gates")

    def __init__(self, region: str, variants: list):
        self.region = region
        self.names = [v.name for v in variants]
        self.gates = []
        for v in variants:
            if v.when is None or v.static is True:
                self.gates.append(None)
            elif v.static is False:
                self.gates.append(False)
            else:
                self.gates.append(compile_gate(v.when))

    def choose(self, facts) -> str:
        for name, g in zip(self.names, self.gates, strict=True):
            if g is None:
                return name
            if g is not False and g(facts):
                return name
        return self.names[-1]


def compile_regions(cp) -> dict[str, RegionGate]:
    live = getattr(cp, "variants", None) or {}
    out = {}
    for rid, region in cp.plan.regions.items():
        variants = live.get(rid) or region.variants
        out[rid] = RegionGate(rid, variants)
    return out


class _SpecTensor:
    """What a gate may ask of a tensor that is not computed yet: dtype, shape, contiguity."""
    __slots__ = ("shape", "dtype", "_contig")

    def __init__(self, spec, bindings):
        self.shape = tuple(eval_int(d, bindings) for d in spec.shape)
        self.dtype = torch_dtype(spec.dtype)
        self._contig = spec.contiguous

    def is_contiguous(self) -> bool:
        return self._contig


class GateTensors:
    """Facts.tensors: live tensors of this call, else their specs."""
    __slots__ = ("env", "specs", "bindings")

    def __init__(self, env, specs, bindings):
        self.env, self.specs, self.bindings = env, specs, bindings

    def __getitem__(self, name):
        t = self.env.get(name)
        if t is None:
            return _SpecTensor(self.specs[name], self.bindings)
        return t


def is_capturing(on_cuda: bool) -> bool:
    return bool(on_cuda and torch.cuda.is_current_stream_capturing())
