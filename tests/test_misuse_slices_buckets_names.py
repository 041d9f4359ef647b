"""What plans written as a new user would write them met next: slices counted from the end,
buckets written as expressions, nested name generators, a dim where a build-time integer goes,
unquoted fractions, p2p gathers the backend can never run, and warnings without a column."""

from __future__ import annotations

import re

import pytest
import torch

from executors.lowering import build_executor
from planner.cli import main
from planner.pipeline import compile_plan
from tests.planutil import HEADER, diagnostic, gated, load, write

H = HEADER.replace("num_tokens: 1..16", "num_tokens: 2..16")


@pytest.mark.parametrize("expr, want", [
    ("x[:, -8:]", lambda x: x[:, -8:]),
    ("x[:, -24:-8]", lambda x: x[:, -24:-8]),
    ("x[:, 3:-1]", lambda x: x[:, 3:-1]),
    ("x[:-1]", lambda x: x[:-1]),
    ("x[-2:]", lambda x: x[-2:]),
])
def test_negative_slice_bounds_count_from_the_end(tmp_path, expr, want):
    plan = load(tmp_path, f"outputs: [y]\nops:\n  - y: copy({expr})\n", H, tp_size=1)
    ex = build_executor(compile_plan(plan), {"w": torch.zeros(32, 64, dtype=torch.bfloat16),
                                             "w2": torch.zeros(16, 64, dtype=torch.bfloat16)}, device="cpu")
    for t in (2, 7):
        x = torch.randn(t, 64).to(torch.bfloat16)
        y = ex(dims={"num_tokens": t}, x=x)["y"]
        assert torch.equal(y, want(x)), (expr, t)


@pytest.mark.parametrize("expr, want", [
    ("x[:, -80:]", "slice [-80:64] (from the end: [-16:64]) is out of bounds for dim 1"),
    ("x[:, :-70]", "slice [0:-70] (from the end: [0:-6]) is out of bounds"),
    ("x[-3:]", "slice [-3:num_tokens] (from the end: [num_tokens - 3:num_tokens]) is out of bounds for dim 0"),
    ("x[:, 10:4]", "slice [10:4] is out of bounds for dim 1 of 'x' (64): the bounds must satisfy 0 <= start"),
])
def test_slices_out_of_bounds_say_what_they_were_counted_as(tmp_path, expr, want):
    d = diagnostic(tmp_path, f"outputs: [y]\nops:\n  - y: copy({expr})\n", H)
    assert d.code == "shape" and want in d.message, d.message
    assert d.loc.line == 16, d.loc


def test_buckets_may_be_expressions_over_params(tmp_path):
    head = HEADER.replace("num_tokens: 1..16", "num_tokens: {range: 1..16, buckets: [1, tp_size, 4 * tp_size, 16]}")
    plan = load(tmp_path, "outputs: [y]\nops:\n  - y: copy(x)\n", head)
    assert plan.dims["num_tokens"].buckets == [1, 2, 8, 16]


@pytest.mark.parametrize("buckets, code, want, at", [
    ("[1, 2 * tp_siz, 16]", "name", "unknown name 'tp_siz'", "tp_siz"),
    ("[1, 40, 16]", "param", "bucket 40 of 'num_tokens' is outside its range 1..16", "40"),
    ("[1, hidden, 16]", "param", "bucket 'hidden' of 'num_tokens' (= 64) is outside its range 1..16", "hidden"),
    ("[1, 2.5, 16]", "type", "bucket 2.5 of 'num_tokens' is not an integer; buckets are sizes, or expressions", "2.5"),
    ("[1, true, 16]", "type", "bucket true of 'num_tokens' is not an integer", "true"),
    ("[]", "param", "buckets of 'num_tokens' must be a non-empty list of sizes in 1..16", "buckets"),
])
def test_bad_buckets_name_the_bucket(tmp_path, buckets, code, want, at):
    line = f"  num_tokens: {{range: 1..16, buckets: {buckets}}}"
    d = diagnostic(tmp_path, "outputs: [y]\nops:\n  - y: copy(x)\n", HEADER.replace("  num_tokens: 1..16", line))
    assert d.code == code and want in d.message, d.message
    assert (d.loc.line, d.loc.col) == (6, line.index(at) + 1), d.loc


def test_name_generators_nest_and_may_use_earlier_variables(tmp_path):
    head = HEADER.replace("  x: bf16[num_tokens, hidden]\n",
                          "  x: bf16[num_tokens, hidden]\n"
                          "  h{i}_{j} for i in [1, 2] for j in [k for k in range(i + 2) if k > i]: bf16[num_tokens, 8]\n")
    body = ('outputs: ["y{i}_{j} for i in [1, 2] for j in [i + 1]"]\nops:\n'
            "  - for: i in [1, 2]\n    ops:\n      - y{i}_{i + 1}: copy(h{i}_{i + 1})\n")
    plan = load(tmp_path, body, head)
    assert [n for n in plan.inputs if n.startswith("h")] == ["h1_2", "h2_3"]
    assert plan.outputs == ["y1_2", "y2_3"]


@pytest.mark.parametrize("gen, want", [
    ("h{i} for i in [1, 2] for i in [3]", "loop variable 'i' is used twice in"),
    ("h{i}_{j} for i in [1, 2] for j in [1 +]", "expected a value but found ']'"),
    ("h{i}_{j} for i in [1, 2] for j in range(300000)", "declares more than"),
])
def test_nested_generator_errors_are_located(tmp_path, gen, want):
    head = HEADER.replace("  x: bf16[num_tokens, hidden]\n", f"  x: bf16[num_tokens, hidden]\n  {gen}: bf16[8]\n")
    d = diagnostic(tmp_path, "outputs: [y]\nops:\n  - y: copy(x)\n", head)
    assert want in d.message and d.loc.line == 11, (d.message, d.loc)


@pytest.mark.parametrize("call, want", [
    ("quantize(x, fp8_e4m3, block=[1, num_tokens])",
     "'block' takes integers or expressions of params, not 'num_tokens': 'num_tokens' is a dim, known only at"),
    ("rmsnorm(x, w[0], eps=1e-6)", "no fractions or exponents); a fractional keyword value goes in quotes"),
    ("rmsnorm(x, w[0], eps=1E5)", "eps='1e-6'"),
])
def test_build_time_values_say_what_they_take(tmp_path, call, want):
    d = diagnostic(tmp_path, f"outputs: [y]\nops:\n  - y, *_: {call}\n".replace(", *_", ""))
    assert want in d.message, d.message
    assert d.loc.line == 16 and d.loc.col > 8, d.loc


def test_quantize_block_naming_a_dim_in_the_long_form(tmp_path):
    body = "outputs: [q, s]\nops:\n  - {op: quantize, x: x, dtype: fp8_e4m3, block: [1, num_tokens], out: [q, s]}\n"
    d = diagnostic(tmp_path, body)
    assert "'num_tokens' is a dim, known only at the call" in d.message, d.message


def test_p2p_gathers_it_can_never_run_are_located_and_cpu_runs_say_cuda(tmp_path, capsys):
    d = diagnostic(tmp_path, "outputs: [y]\nops:\n  - y: all_gather(x, tp, 1, backend=p2p)\n")
    assert d.code == "shape" and "backend=p2p gathers along dim 0 only (here dim 1)" in d.message
    assert d.loc.line == 16, d.loc
    p = write(tmp_path, HEADER.lstrip("\n") + "outputs: [y]\nops:\n  - y: all_gather(x, tp, backend=p2p)\n", "p2p.yaml")
    assert main(["run", str(p), "--num-tokens", "3"]) == 1
    out = capsys.readouterr()
    said = out.out + out.err
    assert "tried p2p: needs CUDA" in said and "hosts" not in said, said


def test_never_runs_warnings_carry_a_column(tmp_path, capsys):
    p = write(tmp_path, HEADER.lstrip("\n") + gated("num_tokens > 100"))
    assert main(["validate", str(p)]) == 0
    err = capsys.readouterr().err
    assert re.search(rf"warning: {re.escape(str(p))}:\d+:\d+: variant 'a' of region r never runs", err), err


@pytest.mark.parametrize("op, want", [
    ("y: extern(f, x, shape=[num_tokens, -3])", "extern 'y': dim 1 of 'y' [num_tokens, -3] is -3, negative"),
    ("y: extern(f, x, shape=[num_tokens - 8, 64])", "is num_tokens - 8, negative at num_tokens=1"),
    ("a, y: split(x, [80, -16], dim=1)", "split 'a': dim 1 of 'y' [num_tokens, -16] is -16, negative"),
    ("y: view(x, [num_tokens, -8, -8])", "view 'y': dim 1 of 'y' [num_tokens, -8, -8] is -8, negative"),
])
def test_negative_sizes_an_op_makes_are_located_errors(tmp_path, op, want):
    d = diagnostic(tmp_path, f"outputs: [y]\nops:\n  - {op}\n")
    assert d.code == "shape" and want in d.message, d.message
    assert d.loc.line == 16, d.loc


def test_the_last_rows_of_a_dynamic_dim_have_a_static_count(tmp_path):
    plan = load(tmp_path, "outputs: [y]\nops:\n  - y: copy(x[-1:])\n", H)
    assert plan.tensors["y"].shape == (1, 64)


def test_world_size_zero_is_refused_not_taken_as_unset(tmp_path, capsys):
    p = write(tmp_path, HEADER.lstrip("\n") + "outputs: [y]\nops:\n  - y: all_reduce(x, tp)\n")
    assert main(["run", str(p), "--world-size", "0"]) == 2
    assert "--world-size must be at least 1" in capsys.readouterr().err


def test_buckets_may_be_a_quoted_list_expression(tmp_path):
    head = HEADER.replace("num_tokens: 1..16", "num_tokens: {range: 1..16, buckets: \"[1, tp_size * 2, 16]\"}")
    assert load(tmp_path, "outputs: [y]\nops:\n  - y: copy(x)\n", head).dims["num_tokens"].buckets == [1, 4, 16]
    head = HEADER.replace("num_tokens: 1..16", "num_tokens: {range: 1..16, buckets: 3}")
    d = diagnostic(tmp_path / "b", "outputs: [y]\nops:\n  - y: copy(x)\n", head)
    assert "(a YAML list such as [1, 8, 64], or a quoted list expression)" in d.message, d.message
