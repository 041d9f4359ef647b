"""Shared pieces of the fp8 GEMM tests: the DeepSeek-V3 / KDA shapes, an fp64 reference of the
scaling math, the comparison bound, and the skip for a missing CuTe DSL."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import executors.cute as ec
from executors.cute import fp8
from executors.cute.fp8 import BLOCK
from tests.fp8emu import random_e4m3_bytes

# DeepSeek-V3 TP8 decode shapes (N, K) and the KDA shapes with fp8 weights
DSV3 = {"qkv_a": (2112, 7168), "q_b": (3072, 1536), "kv_b": (4096, 512), "o_proj": (7168, 2048),
        "mlp_gate_up": (4608, 7168), "mlp_down": (7168, 2304), "shared_gate_up": (512, 7168),
        "shared_down": (7168, 256)}
KDA = {"qkvg": (6144, 7168), "fa_beta": (144, 7168), "fb": (1536, 128)}
SHAPES = {**DSV3, **KDA}
KIND_CODES = {"tensor": 0, "row": 1, "col": 1, "block": 2}


def _e4m3_values() -> np.ndarray:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double().numpy()


E4M3 = _e4m3_values()


def scales(rng, kind: str, rows: int, k: int, operand: str) -> np.ndarray:
    kb = -(-k // BLOCK)
    shape = {"tensor": (1, 1), "row": (rows, 1), "col": (rows, 1),
             "block": (rows, kb) if operand == "a" else (-(-rows // BLOCK), kb)}[kind]
    return rng.uniform(0.25, 4.0, size=shape).astype(np.float32)


def operands(seed, m, n, k, ka, kb_):
    """Random e4m3 x [m, k] and w [n, k] bytes (no NaNs) with scales of these kinds (numpy)."""
    rng = np.random.default_rng(seed)
    x, w = random_e4m3_bytes(rng, (m, k)), random_e4m3_bytes(rng, (n, k))
    return x, w, scales(rng, ka, m, k, "a"), scales(rng, kb_, n, k, "b")


def ref64(x_u8, w_u8, sa, sb, ka, kb_):
    """fp64 (x * sa) @ (w * sb)^T through fp8.dequant_reference's scale expansion."""
    xt = torch.from_numpy(x_u8).view(torch.float8_e4m3fn)
    wt = torch.from_numpy(w_u8).view(torch.float8_e4m3fn)
    m, k = x_u8.shape
    n = w_u8.shape[0]
    fa = fp8._expand_scale(torch.from_numpy(sa).double(), ka, m, k, "a")
    fb = fp8._expand_scale(torch.from_numpy(sb).double(), kb_, n, k, "b")
    return ((xt.double() * fa) @ (wt.double() * fb).t()).numpy()


def close(out, ref, x_u8, w_u8, tol=2e-6):
    """|out - ref| within tol of the magnitude sum (fp32 accumulation of fp8 products)."""
    mag = np.abs(E4M3[x_u8]) @ np.abs(E4M3[w_u8]).T
    scale = np.abs(ref).max() / max(np.abs(E4M3[x_u8] @ E4M3[w_u8].T).max(), 1e-30)
    bound = tol * (mag * max(scale, 1e-30) + np.abs(ref)) + 1e-30
    bad = np.abs(out - ref) > bound
    return not bad.any(), float((np.abs(out - ref) / (np.abs(ref).max() + 1e-30)).max())



def need_cutlass():
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

