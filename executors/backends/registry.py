"""Op implementations keyed by (op kind, backend), each with a capability check.

An implementation is a factory specialised once per op at build time:
  make(op, bctx) -> run(ins, b, out) -> tensor | list[tensor]
  op    the pydantic op model (planner/ops.py)
  bctx  build context: params, input specs, device, process groups, externs
  ins   the op's input tensors, in op.inputs() order
  b     this call's dim bindings ({"num_tokens": 7})
  out   a preallocated destination (a slice of a packed buffer) or None; a runner
        that cannot write there returns a fresh tensor and the caller copies it in.

`supports(op, specs, device) -> None | reason` decides at build time whether a
backend can run an op (specs: the TensorSpecs of the op's inputs); a collective's
backend may also register `placement(op, comm) -> None | reason`, asked with the
process group bound to the op's plan group (where its ranks live). Lookup order:
the op's explicit `backend` field, then the priority list, then torch, which
covers every op on every device. An explicit backend that cannot run the op is an
error naming the op and the backends tried; nothing falls back silently.

This module is the table only; executors.backends lists the backend modules and loads
them before the first lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import BuildError

__all__ = ["Impl", "register", "registered", "impl_of", "find", "UnsupportedOp", "DEFAULT_PRIORITY"]


class UnsupportedOp(BuildError):
    """No registered backend can run an op (or the explicitly requested one cannot)."""


@dataclass(frozen=True)
class Impl:
    kind: str
    backend: str
    make: Callable  # (op, bctx) -> run(ins, b, out)
    supports: Callable  # (op, specs, device) -> None | str
    placement: Callable | None = None  # (op, comm) -> None | str, for collectives


def _always(op, specs, device):
    return None


_REGISTRY: dict[tuple[str, str], Impl] = {}
# flashinfer is opt-in (backend_prefs or an op's backend field): its sub-backends want tuning first
DEFAULT_PRIORITY = ("cute", "p2p", "torch")


def register(kind: str, backend: str, supports: Callable | None = None, placement: Callable | None = None):
    """Decorator: register a factory as the `backend` implementation of op `kind`."""
    def deco(fn):
        _REGISTRY[(kind, backend)] = Impl(kind, backend, fn, supports or _always, placement)
        return fn
    return deco


def impl_of(kind: str, backend: str) -> Impl | None:
    """The implementation registered as `backend` for `kind`, if any (no capability check)."""
    return _REGISTRY.get((kind, backend))


def registered(kind: str) -> list[str]:
    """The backends registered for `kind` so far."""
    return [b for (k, b) in _REGISTRY if k == kind]


def backend_names() -> set[str]:
    """Every backend name registered for some op."""
    return {b for (_, b) in _REGISTRY}


def find(op, specs, device: str, prefs: tuple | list | None = None, comms: dict | None = None) -> Impl:
    """The implementation that runs `op` among those registered; raises UnsupportedOp with every reason.
    comms: {plan group: executors.collectives.Comm}, for the backends' placement checks."""
    kind = op.op
    requested = getattr(op, "backend", "auto")
    tried: list[str] = []
    if requested not in (None, "auto"):
        order = [requested]
    else:
        order = [b for b in (prefs or DEFAULT_PRIORITY)]
        if "torch" not in order:
            order.append("torch")
    for b in order:
        impl = _REGISTRY.get((kind, b))
        if impl is None:
            tried.append(f"{b}: not registered for {kind}")
            continue
        try:
            # what the device and the op allow first, then where the group's ranks live; both
            # reasons where both hold (a CPU run of a group that also spans hosts)
            group = getattr(op, "group", None)
            reasons = [impl.supports(op, specs, device)]
            if impl.placement is not None and comms and group in comms:
                reasons.append(impl.placement(op, comms[group]))
            reason = "; ".join(r for r in reasons if r is not None) or None
        except Exception as exc:  # noqa: BLE001 - a failing checker means "cannot run"
            reason = f"capability check failed: {exc}"
        if reason is None:
            return impl
        tried.append(f"{b}: {reason}")
    raise UnsupportedOp(f"op '{op.id}' ({kind}) cannot run on {device}; tried " + "; ".join(tried))
