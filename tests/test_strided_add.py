"""Tests for the CuTe DSL row-strided bf16 add (executors.cute.elementwise) and its
"add" backend registration (executors.backends.add).

CPU: the module imports without cutlass/GPU, supports_add reasons, registry wiring (on
CPU the plan's add resolves to torch), and, when cutlass is importable, the sm_90a PTX
has 128-bit global loads and stores and no local-memory spills.
GPU (marker ``gpu``): bit-exact vs torch.add for contiguous and strided (packed-slot)
outputs, poisoned outputs, odd row counts, the backend's torch fallback, and replay from
a CUDA graph captured on a side stream.
"""

from __future__ import annotations

import os
import re
from types import SimpleNamespace

import pytest

import executors.cute as ec
from executors.cute import elementwise as ew
from tests.cuteutil import gpu


def test_import_and_supports_add():
    assert ew.supports_add((4, 7168), (28672, 1), (7168, 1), (28672, 1), "bfloat16") is None
    assert ew.supports_add((1, 16), (3, 1), (5, 1), (7, 1), "bf16") is None  # one row: any stride
    assert "dtype" in ew.supports_add((4, 64), (64, 1), (64, 1), (64, 1), "float16")
    assert "multiple of 8" in ew.supports_add((4, 60), (64, 1), (64, 1), (64, 1), "bf16")
    assert "column stride" in ew.supports_add((4, 64), (64, 2), (64, 1), (64, 1), "bf16")
    assert "row stride" in ew.supports_add((4, 64), (64, 1), (68, 1), (64, 1), "bf16")
    assert "row stride" in ew.supports_add((4, 64), (64, 1), (64, 1), (0, 1), "bf16")
    assert "2-D" in ew.supports_add((4, 8, 8), (64, 8, 1), (64, 8, 1), (64, 8, 1), "bf16")
    assert ew.add_config(7168) == (128, 1)
    assert ew.add_config(8192) == (128, 4)


def test_registry_has_cute_add_and_cpu_uses_torch():
    from executors.backends import backends_for, lookup
    from planner.shapes import TensorSpec

    assert {"cute", "torch"} <= set(backends_for("add"))
    op = SimpleNamespace(id="s0", op="add", a="h", b="r", backend="auto")
    specs = [TensorSpec("h", ("num_tokens", 7168), "bf16"), TensorSpec("r", ("num_tokens", 7168), "bf16")]
    assert lookup(op, specs, "cpu").backend == "torch"
    from executors.backends.add import _cute_add_supports

    assert _cute_add_supports(op, specs, "cpu") == "needs a CUDA device"
    f32 = [TensorSpec("h", (4, 64), "f32"), TensorSpec("r", (4, 64), "f32")]
    assert "bf16" in _cute_add_supports(op, f32, "cuda")
    odd = [TensorSpec("h", (4, 60), "bf16"), TensorSpec("r", (4, 60), "bf16")]
    assert "multiple of 8" in _cute_add_supports(op, odd, "cuda")
    dyn = [TensorSpec("h", (4, "hidden"), "bf16"), TensorSpec("r", (4, "hidden"), "bf16")]
    assert "static" in _cute_add_supports(op, dyn, "cuda")


@pytest.fixture(scope="module")
def add_ptx():
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    return {cfg: ew.compile_add_for_arch(*cfg, arch="sm_90a") for cfg in ((128, 1), (128, 4), (256, 1))}


def test_ptx_128bit_loads_and_stores(add_ptx):
    for cfg, ptx in add_ptx.items():
        assert ".target sm_90a" in ptx, cfg
        loads = re.findall(r"ld\.global[.\w:]*\.v4\.(?:u32|b32)", ptx)
        stores = re.findall(r"st\.global[.\w:]*\.v4\.(?:u32|b32)", ptx)
        assert len(loads) == 2 * cfg[1], (cfg, loads)
        assert len(stores) == cfg[1], (cfg, stores)
        # no narrower global accesses of the data
        every = re.findall(r"(?:ld|st)\.global[.\w:]*", ptx)
        assert all(".v4." in x for x in every), (cfg, every)
        assert "cvt.rn.bf16x2.f32" in ptx, cfg
        assert ".local" not in ptx, f"{cfg} spills to local memory"


# --------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------


def _inputs(rows, cols, seed, scale=1.0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(rows, cols, device="cuda", generator=g) * scale).to(torch.bfloat16)
    b = (torch.randn(rows, cols, device="cuda", generator=g) * scale).to(torch.bfloat16)
    return a, b


def _bits_equal(x, y):
    import torch

    return torch.equal(x.contiguous().view(torch.int16), y.contiguous().view(torch.int16))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("rows", [1, 3, 512, 2048, 4097])
@pytest.mark.parametrize("cols", [8, 136, 7168, 8192])
def test_gpu_exact_contiguous(rows, cols):
    import torch

    a, b = _inputs(rows, cols, rows * 31 + cols)
    out = torch.full((rows, cols), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert ew.strided_add(a, b, out) is out
    torch.cuda.synchronize()
    assert _bits_equal(out, torch.add(a, b)), f"rows={rows} cols={cols}"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("rows", [1, 5, 512, 2048])
def test_gpu_exact_packed_slot(rows):
    """Each of 4 states written into its column slot of [rows, 4*7168]; inputs strided too."""
    import torch

    h = 7168
    packed = torch.full((rows, 4 * h), float("nan"), device="cuda", dtype=torch.bfloat16)
    src = torch.randn(rows, 2 * h + 64, device="cuda").to(torch.bfloat16)
    refs = []
    for i in range(4):
        a, b = _inputs(rows, h, 100 + i, scale=3.0 ** i)
        if i == 3:  # strided input: a column slice of a wider tensor
            a = src[:, 64:64 + h]
            assert a.stride(0) == 2 * h + 64
        slot = packed[:, i * h:(i + 1) * h]
        assert slot.stride() == (4 * h, 1)
        ew.strided_add(a, b, slot)
        refs.append(torch.add(a, b))
    torch.cuda.synchronize()
    assert _bits_equal(packed, torch.cat(refs, 1))


@pytest.mark.gpu
@gpu
def test_gpu_special_values_and_rounding():
    import torch

    # ties, subnormals, overflow to inf, signed zeros, large cancellations
    vals = torch.tensor([0.0, -0.0, 1.0, 1.0 + 2 ** -7, 3.0e38, -3.0e38, 1e-39, -1e-39, 2 ** -8,
                         65504.0, 1.5, -2.5, 1e10, -1e10, 7.0, 0.1], device="cuda")
    a = vals.to(torch.bfloat16).repeat(64, 8).reshape(64, 128)
    b = vals.flip(0).to(torch.bfloat16).repeat(64, 8).reshape(64, 128)
    b = b.roll(3, 1).contiguous()
    out = torch.empty_like(a)
    ew.strided_add(a, b, out)
    torch.cuda.synchronize()
    assert _bits_equal(out, torch.add(a, b))
    # out aliasing an input
    ref = torch.add(a, b)
    ew.strided_add(a, b, a)
    torch.cuda.synchronize()
    assert _bits_equal(a, ref)


@pytest.mark.gpu
@gpu
def test_gpu_rejects_bad_calls():
    import torch

    a, b = _inputs(4, 64, 7)
    with pytest.raises(ValueError):
        ew.strided_add(a, b, torch.empty(4, 64, device="cuda", dtype=torch.float16))
    wide = torch.empty(4, 72, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError):  # 16-byte misaligned base
        ew.strided_add(a, b, wide[:, 1:65])
    assert not ew.can_run(a, b, wide[:, 1:65])


@pytest.mark.gpu
@gpu
def test_gpu_graph_capture_side_stream():
    import torch

    rows, h = 2048, 7168
    a, b = _inputs(rows, h, 11)
    packed = torch.full((rows, 4 * h), float("nan"), device="cuda", dtype=torch.bfloat16)
    slot = packed[:, h:2 * h]
    ew.strided_add(a, b, slot)  # compile outside the capture
    packed.fill_(float("nan"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        ew.strided_add(a, b, slot)
    torch.cuda.synchronize()
    assert torch.isnan(packed.float()).all(), "capture must not run the kernel"
    for seed in (12, 13):
        a2, b2 = _inputs(rows, h, seed)
        a.copy_(a2)
        b.copy_(b2)
        g.replay()
        torch.cuda.synchronize()
        assert _bits_equal(slot, torch.add(a2, b2))
        assert torch.isnan(packed[:, :h].float()).all() and torch.isnan(packed[:, 2 * h:].float()).all()


@pytest.mark.gpu
@gpu
def test_gpu_backend_runner_and_fallback():
    import torch

    from executors.backends import lookup
    from executors.backends.add import _cute_add
    from planner.shapes import TensorSpec

    op = SimpleNamespace(id="s0", op="add", a="h", b="r", backend="auto")
    specs = [TensorSpec("h", ("num_tokens", 7168), "bf16"), TensorSpec("r", ("num_tokens", 7168), "bf16")]
    assert lookup(op, specs, "cuda").backend == "cute"
    run = _cute_add(op, None)
    a, b = _inputs(64, 7168, 21)
    packed = torch.full((64, 4 * 7168), float("nan"), device="cuda", dtype=torch.bfloat16)
    slot = packed[:, 7168:2 * 7168]
    assert run([a, b], {}, slot) is slot
    assert _bits_equal(slot, torch.add(a, b))
    r = run([a, b], {}, None)
    assert _bits_equal(r, torch.add(a, b))
    # misaligned slot: falls back to torch.add, still exact
    wide = torch.full((64, 7168 + 8), float("nan"), device="cuda", dtype=torch.bfloat16)
    mis = wide[:, 1:7169]
    assert run([a, b], {}, mis) is mis
    assert _bits_equal(mis, torch.add(a, b))
