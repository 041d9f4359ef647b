"""Optional "add" backend: the CuTe DSL row-strided bf16 add (executors.cute.elementwise).

Zero-copy packing makes add producers write into a column slot of a packed buffer (row
stride = the packed width); torch.add does not vectorize that strided output, this
kernel does (128-bit loads and stores, fp32 add, bf16 round: bit-identical to torch.add).

Capability (build time): CUDA device, bf16 inputs, 2-D, a static column count that is a
multiple of 8, cutlass importable and an sm_90+ GPU. Per call the runner takes the kernel
when this call's tensors fit (unit column stride, row strides % 8, 16-byte aligned) and
torch.add otherwise; an op that names backend "cute" explicitly gets the kernel or an
error. Nothing GPU-specific is imported until a check or a run needs it.
"""

from __future__ import annotations

import torch

from .registry import register

__all__: list[str] = []


def _cute_add_supports(op, specs, device):
    if device != "cuda":
        return "needs a CUDA device"
    if len(specs) != 2:
        return f"needs 2 inputs, got {len(specs)}"
    for s in specs:
        if s.dtype != "bf16":
            return f"needs bf16 inputs, got {s.dtype}"
        if len(s.shape) != 2:
            return f"needs 2-D inputs, got rank {len(s.shape)}"
    cols = specs[0].shape[-1]
    if not isinstance(cols, int):
        return f"column count {cols} is not static"
    if cols < 8 or cols % 8:
        return f"column count {cols} is not a multiple of 8"
    from .. import cute
    if not cute.available():
        return "cutlass DSL not importable or GPU older than sm_90"
    return None


@register("add", "cute", supports=_cute_add_supports)
def _cute_add(op, bctx):
    from ..cute import elementwise as ew
    explicit = getattr(op, "backend", "auto") == "cute"  # Add has no backend field today

    def run(ins, b, out):
        x, y = ins
        dst = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if ew.can_run(x, y, dst):
            return ew.strided_add(x, y, dst)
        if explicit:
            why = ew.supports_add(tuple(dst.shape), x.stride(), y.stride(), dst.stride(), dst.dtype)
            raise RuntimeError(f"op '{op.id}': backend cute cannot run this add: "
                               f"{why or 'tensors not 16-byte aligned, not CUDA or not bf16'}")
        if out is not None:
            return torch.add(x, y, out=out)
        return torch.add(x, y)
    return run
