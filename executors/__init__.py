"""Executors: lower a compiled plan to a callable (streams, events, gating, collectives).

    from executors import build_executor
    ex = build_executor(compiled, weights, group=pg, device="cuda", externs={...})
    outs = ex(x=hidden_states)           # {output name: tensor}
    ex.last_variants                      # {region: variant that ran}

GPU-only pieces (executors.cute, FlashInfer, CUDA graphs) are imported lazily.
"""

from .backends import UnsupportedOp, lookup, register
from .errors import BuildError
from .executor import Executor
from .lowering import build_executor, default_schedule

__all__ = ["build_executor", "Executor", "BuildError", "UnsupportedOp", "register", "lookup", "default_schedule"]
