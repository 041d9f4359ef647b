"""Every op of the torch backend against a straightforward reference, plus registry rules."""

from __future__ import annotations

import pytest
import torch

from executors.backends import UnsupportedOp, backends_for, lookup, register
from executors.collectives import Comm
from planner.ops import OP_KINDS, OP_MODELS
from planner.shapes import TensorSpec


class _B:
    """Minimal build context: params, specs, a size-1 group, externs."""

    def __init__(self, params=None, specs=None, externs=None, comm=None):
        self.params = params or {}
        self.specs = specs or {}
        self.device = "cpu"
        self._externs = externs or {}
        self._comm = comm or Comm("tp", None, 1, 0)

    def comm(self, g):
        return self._comm

    def extern(self, n):
        return self._externs[n]


def _run(kind, fields, ins, b=None, bctx=None, out=None):
    op = OP_MODELS[kind](op=kind, id="t", out=fields.pop("out", ["y"]), **fields)
    specs = [TensorSpec(f"i{i}", tuple(t.shape), "bf16") for i, t in enumerate(ins)]
    impl = lookup(op, specs, "cpu", ("torch",))
    return impl.make(op, bctx or _B())(ins, b or {}, out)


def _r(*shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def test_torch_covers_every_op_kind():
    missing = [k for k in OP_KINDS if k != "select" and "torch" not in backends_for(k)]
    assert missing == []


def test_gemm_matches_matmul_and_out_dtype():
    a, w = _r(5, 32), _r(24, 32, seed=1)
    y = _run("gemm", {"a": "a", "b": "w"}, [a, w], bctx=_B(specs={"a": TensorSpec("a", (5, 32), "bf16")}))
    assert torch.equal(y, a @ w.t())
    y32 = _run("gemm", {"a": "a", "b": "w", "out_dtype": "fp32"}, [a, w],
               bctx=_B(specs={"a": TensorSpec("a", (5, 32), "bf16")}))
    assert y32.dtype == torch.float32
    assert torch.allclose(y32, a.float() @ w.float().t(), rtol=1e-5, atol=1e-5)


def test_gemm_writes_into_strided_slot():
    a, w = _r(4, 16), _r(8, 16, seed=1)
    packed = torch.zeros(4, 20, dtype=torch.bfloat16)
    slot = packed.narrow(1, 6, 8)
    y = _run("gemm", {"a": "a", "b": "w"}, [a, w], bctx=_B(specs={"a": TensorSpec("a", (4, 16), "bf16")}), out=slot)
    y = slot.copy_(y) if y is not slot else y
    assert torch.equal(packed[:, 6:14], a @ w.t())
    assert packed[:, :6].abs().sum() == 0 and packed[:, 14:].abs().sum() == 0


def test_add_split_slice_view_copy():
    a, b = _r(3, 8), _r(3, 8, seed=1)
    assert torch.equal(_run("add", {"a": "a", "b": "b"}, [a, b]), a + b)
    parts = _run("split", {"x": "a", "sizes": [2, "k"], "dim": -1, "out": ["p", "q"]}, [a], bctx=_B(params={"k": 6}))
    assert [p.shape[1] for p in parts] == [2, 6] and torch.equal(parts[1], a[:, 2:])
    assert parts[1].data_ptr() == a[:, 2:].data_ptr()  # a view, not a copy
    eq = _run("split", {"x": "a", "sizes": 4, "out": ["p", "q"]}, [a])
    assert torch.equal(eq[0], a[:, :4]) and torch.equal(eq[1], a[:, 4:])
    s = _run("slice", {"x": "a", "dim": 0, "start": 1, "stop": "n"}, [a], b={"n": 3})
    assert torch.equal(s, a[1:3])
    v = _run("view", {"x": "a", "shape": ["n", 2, 4]}, [a], b={"n": 3})
    assert torch.equal(v, a.view(3, 2, 4))
    c = _run("copy", {"x": "a", "dtype": "fp32"}, [a[:, 1:5]])
    assert c.dtype == torch.float32 and c.is_contiguous() and torch.equal(c, a[:, 1:5].float())


def test_cat_plain_and_inplace_members():
    xs = [_r(2, 3, seed=i) for i in range(3)]
    assert torch.equal(_run("cat", {"xs": ["a", "b", "c"], "dim": -1}, xs), torch.cat(xs, -1))
    packed = torch.empty(2, 9, dtype=torch.bfloat16)
    packed[:, 3:6] = xs[1]  # the producer of b wrote its slot already
    marker = packed[:, 3:6].clone()
    y = _run("cat", {"xs": ["a", "b", "c"], "dim": 1, "inplace": ["b"]}, [xs[0], packed[:, 3:6], xs[2]], out=packed)
    assert y is packed and torch.equal(y, torch.cat(xs, 1)) and torch.equal(y[:, 3:6], marker)


def test_pad_and_shard_follow_vllm_sp_shard():
    x = _r(10, 4)
    p = _run("pad", {"x": "x", "dim": 0, "multiple": 4}, [x])
    assert p.shape == (12, 4) and torch.equal(p[:10], x) and p[10:].abs().sum() == 0
    for world in (1, 2, 3, 4):
        pad = (-10) % world
        ref = torch.nn.functional.pad(x.float(), (0, 0, 0, pad)).to(x.dtype)
        chunk = ref.shape[0] // world
        for rank in range(world):
            y = _run("shard", {"x": "x", "group": "tp", "dim": 0}, [x], bctx=_B(comm=Comm("tp", None, world, rank)))
            assert torch.equal(y, ref[rank * chunk:(rank + 1) * chunk])


def test_extern_checks_declared_shape():
    x = _r(3, 4)
    ok = _run("extern", {"fn": "f", "args": ["x"], "shape": ["n", 4]}, [x], b={"n": 3},
              bctx=_B(externs={"f": lambda t: t * 2}))
    assert torch.equal(ok, x * 2)
    with pytest.raises(RuntimeError, match="extern 'f'.*returned"):
        _run("extern", {"fn": "f", "args": ["x"], "shape": ["n", 5]}, [x], b={"n": 3},
             bctx=_B(externs={"f": lambda t: t}))


def test_collectives_on_a_single_rank_are_identity():
    x = _r(4, 6)
    assert torch.equal(_run("all_gather", {"x": "x", "group": "tp", "dim": 1}, [x]), x)
    assert torch.equal(_run("reduce_scatter", {"x": "x", "group": "tp", "dim": 0}, [x]), x)
    assert torch.equal(_run("all_reduce", {"x": "x", "group": "tp"}, [x]), x)


def test_explicit_backend_that_cannot_run_names_op_and_backends():
    op = OP_MODELS["gemm"](op="gemm", id="g7", out=["y"], a="a", b="w", backend="cute")
    specs = [TensorSpec("a", (4, 16), "bf16"), TensorSpec("w", (8, 16), "bf16")]
    with pytest.raises(UnsupportedOp, match=r"op 'g7' \(gemm\).*tried cute"):
        lookup(op, specs, "cpu")


def test_priority_order_and_capability_check():
    calls = []

    @register("add", "testbk", supports=lambda op, specs, dev: None if specs[0].shape[0] == 2 else "needs 2 rows")
    def _mk(op, bctx):
        calls.append(op.id)
        return lambda ins, b, out: ins[0] - ins[1]

    op = OP_MODELS["add"](op="add", id="a1", out=["y"], a="a", b="b")
    two = [TensorSpec("a", (2, 3), "bf16")] * 2
    three = [TensorSpec("a", (3, 3), "bf16")] * 2
    assert lookup(op, two, "cpu", ("testbk", "torch")).backend == "testbk"
    assert lookup(op, three, "cpu", ("testbk", "torch")).backend == "torch"  # auto: next in priority
    assert lookup(op, two, "cpu", ("torch",)).backend == "torch"
