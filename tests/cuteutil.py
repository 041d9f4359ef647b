"""Shared by the CuTe kernel tests: the skip mark for tests that need an sm_90 GPU and cutlass."""

from __future__ import annotations

import pytest

import executors.cute as ec


def _gpu_ready() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and ec.available()
    except Exception:
        return False


gpu = pytest.mark.skipif(not _gpu_ready(), reason="needs CUDA cc>=9.0 and cutlass")
