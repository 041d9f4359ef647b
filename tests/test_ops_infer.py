"""Shape/dtype inference of every op kind, and the mismatches each one rejects."""

import pytest

from planner.shapes import fmt_shape
from tests.planutil import error, load


def shape(plan, name):
    t = plan.tensors[name]
    return fmt_shape(t.shape) + " " + t.dtype


@pytest.mark.parametrize("body, name, want", [
    ("  - y: gemm(x, w)\n", "y", "[num_tokens, 32] bf16"),
    ("  - y: gemm(x, w, out_dtype=fp32)\n", "y", "[num_tokens, 32] fp32"),
    ("  - y: gemm(x, w[:8])\n", "y", "[num_tokens, 8] bf16"),
    ("  - y: all_gather(x, tp)\n", "y", "[num_tokens * 2, 64] bf16"),
    ("  - y: all_gather(x, tp, dim=1)\n", "y", "[num_tokens, 128] bf16"),
    ("  - y: all_reduce(x, tp)\n", "y", "[num_tokens, 64] bf16"),
    ("  - y: reduce_scatter(x, tp, dim=1)\n", "y", "[num_tokens, 32] bf16"),
    ("  - y: reduce_scatter(pad(x, 2), tp)\n", "y", "[round_up(num_tokens, 2) / 2, 64] bf16"),
    ("  - y: shard(x, tp)\n", "y", "[ceil_div(num_tokens, 2), 64] bf16"),
    ("  - y: pad(x, 8)\n", "y", "[round_up(num_tokens, 8), 64] bf16"),
    ("  - y: add(x, x)\n", "y", "[num_tokens, 64] bf16"),
    ("  - y: copy(x, dtype=fp32)\n", "y", "[num_tokens, 64] fp32"),
    ("  - y: view(x, [num_tokens, 8, 8])\n", "y", "[num_tokens, 8, 8] bf16"),
    ("  - y: cat([x, x], dim=1)\n", "y", "[num_tokens, 128] bf16"),
    ("  - y: cat(x, x, dim=0)\n", "y", "[num_tokens + num_tokens, 64] bf16"),
    ("  - y: x[1:num_tokens]\n", "y", "[num_tokens - 1, 64] bf16"),
    ("  - y: x[:, 16:48]\n", "y", "[num_tokens, 32] bf16"),
    ("  - y: slice(x, dim=1, start=8, stop=16)\n", "y", "[num_tokens, 8] bf16"),
    ("  - y, z: split(x, [48, 16])\n", "z", "[num_tokens, 16] bf16"),
    ("  - y, _, z: split(x, 16)\n  - q: copy(z)\n", "q", None),
    ("  - y: extern(my_fn, x, shape=[num_tokens, 7], dtype=fp32)\n", "y", "[num_tokens, 7] fp32"),
    ("  - y: all_gather(x, tp)[:num_tokens]\n", "y", "[num_tokens, 64] bf16"),
])
def test_infer(tmp_path, body, name, want):
    if "q: copy(z)" in body:
        err = error(tmp_path, "outputs: [q]\nops:\n" + body)
        assert "4 pieces but 3 output names" in str(err)
        return
    plan = load(tmp_path, f"outputs: [{name}]\nops:\n" + body)
    assert shape(plan, name) == want


def test_split_views_are_strided(tmp_path):
    plan = load(tmp_path, "outputs: [a, b]\nops:\n  - a, b: split(x, [32, 32])\n")
    assert not plan.tensors["a"].contiguous and plan.tensors["a"].alias_of == "x"


@pytest.mark.parametrize("body, code, words, line, col", [
    ("  - y: gemm(x, w2[:, :32])\n", "shape", "K mismatch", 16, 16),
    ("  - y: gemm(x, copy(w, dtype=fp32))\n", "shape", "dtype mismatch", 16, 16),
    ("  - y, z: split(x, [48, 15])\n", "shape", "split sizes sum to 63 but 'x' has 64 on dim -1", 16, 20),
    ("  - y, z: split(x, [8, 8], dim=0)\n", "shape", "sum to 16 but 'x' has num_tokens", 16, 20),
    ("  - y: all_gather(x, tp, dim=2)\n", "shape", "dim 2 does not exist", 16, 30),
    ("  - y: all_gather(x, dp)\n", "name", "unknown group 'dp'", 16, 22),
    ("  - y: reduce_scatter(x, tp)\n", "shape", "not always a multiple of the group size", 16, 23),
    ("  - y: add(x, w)\n", "shape", "shape mismatch", 16, 15),
    ("  - y: cat([x, w], dim=1)\n", "shape", "dim 0 differs", 16, 12),
    ("  - y: x[0:num_tokens + 1]\n", "shape", "out of bounds", 16, 8),
    ("  - y: view(x, [num_tokens, 9])\n", "shape", "different element count", 16, 16),
    ("  - y: view(split(x, [32, 32])[0], [num_tokens, 32])\n", "expr", "integer indexing", 16, 0),
    ("  - y: pad(x, num_tokens)\n", "shape", "positive constant", 16, 15),
    ("  - y: copy(x, dtype=fp9)\n", "type", "unknown dtype 'fp9'", 16, 22),
    ("  - y: extern(f, x, shape=[num_tokens, hiden])\n", "name", "unknown name 'hiden'", 16, 0),
    ("  - y: gemm(x)\n", "schema", "'b' is required", 16, 0),
    ("  - y: gemm(x, w, alpha=2)\n", "schema", "gemm has no argument 'alpha'", 16, 25),
])
def test_infer_errors(tmp_path, body, code, words, line, col):
    err = error(tmp_path, "outputs: [y]\nops:\n" + body)
    d = err.diagnostics[0]
    assert d.code == code or code == "expr", d.format()
    assert words in d.message, d.format()
    assert d.loc.file.endswith("plan.yaml") and d.loc.line == line, d.format()
    if col:
        assert d.loc.col == col, d.format()
