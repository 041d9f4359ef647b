"""The embedding examples run on CPU: an nn.Module forward calling the compiled plan."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

EX = Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    # a plain import (not exec from a path) so spawned ranks can unpickle the module's functions
    if str(EX) not in sys.path:
        sys.path.insert(0, str(EX))
    return importlib.import_module(name)


def test_kda_projection_module_forward_on_cpu():
    mod = _load("kda_projection_module")
    r = mod.main("cpu", m=3)
    assert r["eager_variant"] == {"kda_projection.0": "packed"} and r["eager_max_err"] == 0.0
    block = mod.KDAProjection(mod.SMALL)
    x = torch.randn(2, 256).bfloat16()
    outs = block(x)
    assert [tuple(o.shape) for o in outs] == [(2, 384), (2, 128), (2, 128), (2, 8)]
    # a caller's capture makes `capturing` true: force it through the facts to see the other variant run
    f = block.executor.facts({"x": x}, capturing=True)
    out2 = block.executor(x=x, _facts=f)
    assert block.executor.last_variants == {"kda_projection.0": "two_branch"}
    for a, b in zip(outs, (out2["mixed_qkv"], out2["g_proj"], out2["g1"], out2["beta"]), strict=False):
        assert torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def test_sp_tail_module_two_gloo_ranks():
    mod = _load("sp_tail_module")
    res = mod.main(world=2, hidden=32, num_tokens=7)
    assert [r["ok"] for r in res] == [True, True]
    assert all(r["shape"] == [7, 32] and r["gathers"] == 1 for r in res)
