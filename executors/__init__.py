"""Executors: lower a compiled plan to a callable (streams, events, gating, collectives).

    from executors import build_executor
    ex = build_executor(compiled, weights, group=pg, device="cuda", externs={...})
    outs = ex(x=hidden_states)           # {output name: tensor}
    ex.last_variants                      # {region: variant that ran}
    torch.compile(model)                  # ex(...) traces as one custom op (executors.custom_op)

GPU-only pieces (executors.cute, FlashInfer, CUDA graphs) are imported lazily.
"""

from .backends import UnsupportedOp, lookup, register
from .errors import BuildError, InputError
from .executor import Executor
from .lowering import build_executor, default_schedule
from .weights import load_weights, prepare_weights

__all__ = ["build_executor", "Executor", "BuildError", "InputError", "UnsupportedOp", "register", "lookup",
           "default_schedule", "prepare_weights", "load_weights"]
