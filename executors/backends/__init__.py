"""Backends: implementations of op kinds keyed by (op, backend), with capability checks.

The one list of backend modules is the import in _load() below; each registers its implementations
into executors.backends.registry when first loaded (before the first lookup), and none
imports a GPU library until a capability check or a run needs it.
  torch_ops  every op kind, on CPU and GPU (the fallback), with torch_fp8 (scaled gemms,
             quantize; inductor quantize) and torch_pointwise (norms, activations, mul, rope)
  gemm       CuTe DSL skinny GEMMs (executors.cute, bf16 and fp8) and FlashInfer mm_bf16 / fp8 GEMMs
  gemm_chain the fused two-GEMM op: the CuTe KDA step kernel, and torch's two GEMMs
  flashinfer_ops  FlashInfer norms, activations, rope and per-token-group fp8 quantize
  add        the CuTe DSL strided add (writes into packed slots)
  p2p        the symmetric-memory all-gather for CUDA graphs
  allreduce_norm  all_reduce_add_rmsnorm: the collective then the torch norm, or FlashInfer's fused
             all-reduce + residual + RMSNorm kernel within the tuned size limits
"""

from __future__ import annotations

from .registry import DEFAULT_PRIORITY, Impl, UnsupportedOp, find, register, registered
from .registry import backend_names as _names

__all__ = ["DEFAULT_PRIORITY", "Impl", "UnsupportedOp", "register", "lookup", "backends_for", "backend_names"]

_loaded = False


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        from . import (  # noqa: F401
            add,
            allreduce_norm,
            flashinfer_ops,
            gemm,
            gemm_chain,
            p2p,
            torch_fp8,
            torch_ops,
            torch_pointwise,
        )


def backends_for(kind: str) -> list[str]:
    """Every backend that implements `kind`."""
    _load()
    return registered(kind)


def backend_names() -> set[str]:
    """Every registered backend name (of any op kind)."""
    _load()
    return _names()


def lookup(op, specs, device: str, prefs: tuple | list | None = None, comms: dict | None = None) -> Impl:
    """The implementation that runs `op` on `device`; raises UnsupportedOp with every reason."""
    _load()
    return find(op, specs, device, prefs, comms)
