"""The executor's custom op under torch.compile: model code that writes state (effects=true) is
kept and ordered (the inputs it writes are declared written), such code given a weight is refused,
returned buffers never alias each other, and tensor names that are words of Python or of the
schema language still make an op."""

from __future__ import annotations

import pytest
import torch

from executors import build_executor
from executors.tools.check import compile_for_run
from planner.lang.loader import load_plan
from tests.planutil import error, write

KV = """
plan: kv_write
params: {hidden: 32, slots: 64}
dims: {num_tokens: 1..16}
inputs:
  k: bf16[num_tokens, hidden]
  slot_ids: int64[num_tokens]
  kv_cache: bf16[slots, hidden]
weights:
  w: bf16[hidden, hidden]
outputs: [y]
ops:
  - _: extern(cache_write, k, slot_ids, kv_cache, shape=[1], effects=true WRITES)
  - y: gemm(k, w)
"""


def cache_write(k, ids, cache):
    cache.index_copy_(0, ids, k)
    return torch.zeros(1, dtype=torch.bfloat16)


def _kv(tmp_path, text):
    w = {"w": torch.randn(32, 32, generator=torch.Generator().manual_seed(0)).bfloat16()}
    return build_executor(compile_for_run(load_plan(write(tmp_path, text))), w, device="cpu",
                          externs={"cache_write": cache_write})


@pytest.mark.parametrize("writes, written", [(", writes=[kv_cache]", ["kv_cache"]),
                                             ("", ["k", "slot_ids", "kv_cache"])])
def test_a_cache_write_is_kept_and_ordered_under_compile(tmp_path, writes, written):
    ex = _kv(tmp_path, KV.replace(" WRITES", writes))
    schema = str(ex._op._schema)
    for n in ["k", "slot_ids", "kv_cache"]:
        assert ("Tensor(m" in schema.split(f" {n},")[0].rsplit(",", 1)[-1]) == (n in written), schema

    def step(k, ids, c):
        before = c.float().sum()
        return ex(k=k, slot_ids=ids, kv_cache=c)["y"], before
    k, ids = torch.ones(3, 32).bfloat16(), torch.tensor([0, 5, 9])
    with torch.no_grad():
        c = torch.zeros(64, 32).bfloat16()
        y, before = torch.compile(step, fullgraph=True, dynamic=True)(k, ids, c)
    assert before.item() == 0.0 and c.float().sum().item() == 96.0  # read before the write, then written
    torch.testing.assert_close(y, ex(k=k, slot_ids=ids, kv_cache=torch.zeros(64, 32).bfloat16())["y"])


def test_model_code_writing_a_weight_is_refused_under_compile(tmp_path):
    text = KV.replace("  kv_cache: bf16[slots, hidden]\nweights:\n", "weights:\n  kv_cache: bf16[slots, hidden]\n")
    ex = build_executor(compile_for_run(load_plan(write(tmp_path, text.replace(" WRITES", "")))),
                        {"w": torch.zeros(32, 32).bfloat16(), "kv_cache": torch.zeros(64, 32).bfloat16()},
                        device="cpu", externs={"cache_write": cache_write})
    with torch.no_grad(), pytest.raises(Exception, match="is given weight 'kv_cache', whose writes torch.compile"
                                                          " cannot see"):
        torch.compile(lambda k, i: ex(k=k, slot_ids=i)["y"], fullgraph=True)(torch.ones(3, 32).bfloat16(),
                                                                            torch.tensor([0, 1, 2]))


def test_writes_names_arguments_of_effects_code(tmp_path):
    head = KV.split("outputs:")[0]
    e = error(tmp_path, "outputs: [y]\nops:\n  - _: extern(f, k, kv_cache, shape=[1], effects=true, writes=[v])\n"
                        "  - y: gemm(k, w)\n", head)
    assert "writes= names 'v', which is not an argument of this code (arguments: k, kv_cache)" in str(e)
    e = error(tmp_path, "outputs: [y]\nops:\n  - y: extern(f, k, kv_cache, shape=[1], writes=[kv_cache])\n", head)
    assert "writes= names what effects=true code writes in place; add effects=true" in str(e)


def test_two_results_in_one_memory_are_returned_apart(tmp_path):
    p = write(tmp_path, """
plan: alias
dims: {num_tokens: 1..8}
inputs:
  x: bf16[num_tokens, 32]
weights:
  w: bf16[32, 32]
outputs: [y, e]
ops:
  - y: gemm(x, w)
  - e: extern(passthrough, y, shape=[num_tokens, 32])
""")
    ex = build_executor(compile_for_run(load_plan(p)), {"w": torch.randn(32, 32).bfloat16()}, device="cpu",
                        externs={"passthrough": lambda t: t})
    with torch.no_grad():
        o = torch.compile(lambda x: ex(x=x), fullgraph=True, dynamic=True)(torch.randn(3, 32).bfloat16())
    assert o["y"].untyped_storage().data_ptr() != o["e"].untyped_storage().data_ptr()
    torch.testing.assert_close(o["y"], o["e"])


@pytest.mark.parametrize("name", ["None", "lambda", "from", "Tensor", "out_in"])
def test_tensor_names_that_are_reserved_words_make_an_op(tmp_path, name):
    out = "y"
    if name == "out_in":  # an output named 'in'
        name, out = "x", "in"
    p = write(tmp_path, f"""
plan: kw
dims: {{num_tokens: 1..8}}
inputs:
  {name}: bf16[num_tokens, 32]
weights:
  w: bf16[32, 32]
outputs: [{out}]
ops:
  - {out}: gemm({name}, w)
""")
    ex = build_executor(compile_for_run(load_plan(p)), {"w": torch.randn(32, 32).bfloat16()}, device="cpu")
    x = torch.randn(3, 32).bfloat16()
    with torch.no_grad():
        got = torch.compile(lambda t: ex(**{name: t})[out], fullgraph=True, dynamic=True)(x)
    torch.testing.assert_close(got, ex(**{name: x})[out])


def test_a_plan_of_effects_only_is_refused_under_compile(tmp_path):
    """No outputs: Inductor dropped the call (dynamic shapes, no_grad) though the op declares its
    writes, so the cache was never written."""
    text = KV.replace(" WRITES", ", writes=[kv_cache]").replace("outputs: [y]\n", "outputs: []\n").replace(
        "  - y: gemm(k, w)\n", "")
    ex = _kv(tmp_path, text)
    with torch.no_grad(), pytest.raises(Exception, match="has no outputs, only model code run for effects"):
        torch.compile(lambda k, i, c: ex(k=k, slot_ids=i, kv_cache=c), fullgraph=True, dynamic=True)(
            torch.ones(3, 32).bfloat16(), torch.tensor([0, 1, 2]), torch.zeros(64, 32).bfloat16())
