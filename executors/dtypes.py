"""Plan dtype names -> torch dtypes (the runtime's one table)."""

from __future__ import annotations

import torch

__all__ = ["TORCH_DTYPES", "torch_dtype", "plan_dtype"]

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "int32": torch.int32,
                "int64": torch.int64, "int8": torch.int8, "uint8": torch.uint8,
                "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


def plan_dtype(dt) -> str:
    """The plan's name of a torch dtype (bf16), for messages that speak the plan's language."""
    return _NAMES.get(dt, str(dt).replace("torch.", ""))
