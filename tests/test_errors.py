"""Every error class: located, readable, exit code 2, nothing executed."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from planner.cli import main
from planner.errors import CODES
from tests.planutil import HEADER, error, write

CASES = {
    "yaml": ("inputs:\n  y: [num_tokens, 8] bf16\n", "YAML syntax"),
    "schema": ("outputs: [y]\nops:\n  - {op: gemm, a: x, b: w, out: y, bias: z}\n", "'bias' is not a field"),
    "expr": ("outputs: [y]\nops:\n  - y: gemm(x, w\n", "expected ')'"),
    "name": ("outputs: [y]\nops:\n  - y: gemm(x, ww)\n", "undefined tensor 'ww'"),
    "type": ("outputs: [y]\nops:\n  - y: copy(x, dtype=fp7)\n", "unknown dtype"),
    "shape": ("outputs: [y]\nops:\n  - y: gemm(x, w2[:, :8])\n", "K mismatch"),
    "dup": ("outputs: [y]\nops:\n  - y: copy(x)\n  - y: copy(x)\n", "defined twice"),
    "cycle": ("outputs: [y]\nops:\n  - y: add(z, x)\n  - z: add(y, x)\n", "cycle"),
    "variant": ("outputs: [y]\nvariants:\n  - name: a\n    ops: [{y: copy(x)}]\n  - name: b\n    ops: [{y: copy(x)}]\n",
                "not last"),
    "include": ("include: [../outside.yaml]\noutputs: [x]\nops: []\n", "leaves the plan's directory"),
    "limit": ("outputs: [x]\nops:\n  - for: i in range(3000000)\n    ops: []\n", "too long"),
    "stream": ("outputs: [y]\nops:\n  - {op: copy, x: x, out: y, stream: 'two words'}\n", "not an identifier"),
    "param": ("outputs: [x]\nops:\n  - for: i in range(hidden / 3)\n    ops: []\n", "does not divide"),
}


@pytest.mark.parametrize("code", sorted(CASES))
def test_error_class(tmp_path, code):
    body, words = CASES[code]
    err = error(tmp_path / "sub", body)
    d = err.diagnostics[0]
    assert d.code == code, d.format()
    assert words in d.message + (d.hint or ""), d.format()
    assert d.loc is not None and d.loc.file.endswith("plan.yaml") and d.loc.line > 0, d.format()


def test_every_documented_code_is_tested():
    tested = set(CASES) | {"io"}  # io: test_unreadable_file
    assert set(CODES) <= tested


@pytest.mark.parametrize("body, words", [
    ("params:\n  tp_size: {value: 3, choices: [1, 2, 4, 8]}\noutputs: [x]\nops: []\n", "not one of"),
    ("params:\n  a: b * 2\n  b: a + 1\noutputs: [x]\nops: []\n", "cycle"),
])
def test_param_errors(tmp_path, body, words):
    hdr = "plan: t\ndims: {num_tokens: 1..4}\ninputs: {x: 'bf16[num_tokens, 8]'}\n"
    err = error(tmp_path, body, header=hdr)
    assert words in str(err)


def test_set_unknown_param_suggests(tmp_path, capsys):
    p = write(tmp_path, HEADER + "outputs: [x]\nops: []\n")
    assert main(["validate", str(p), "--set", "tp_sise=4"]) == 2
    err = capsys.readouterr().err
    assert "no param 'tp_sise'" in err and "did you mean 'tp_size'" in err


def test_unreadable_file(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read plan" in capsys.readouterr().err


@pytest.mark.parametrize("payload", [
    "params: {hidden: \"__import__('os').system('touch PWNED')\"}",
    "params: {hidden: !!python/object/apply:os.system ['touch PWNED']}",
    "outputs: [y]\nops:\n  - y: \"gemm(x, w).__class__.__mro__\"",
    "outputs: [y]\nvariants:\n  - {name: a, when: \"exec('open(1)')\", ops: [{y: copy(x)}]}\n  - {name: b, ops: [{y: copy(x)}]}",
    "outputs: [\"{__import__('os').system('touch PWNED')}\"]\nops: []",
])
def test_injected_code_is_never_run(tmp_path, payload):
    os.chdir(tmp_path)
    p = write(tmp_path, "plan: t\ndims: {num_tokens: 1..4}\ninputs: {x: 'bf16[num_tokens, 8]'}\n"
              "weights: {w: 'bf16[8, 8]'}\n" + payload + "\n")
    assert main(["validate", str(p)]) == 2
    assert not (tmp_path / "PWNED").exists()


def test_cli_process_exit_codes_and_no_traceback(tmp_path):
    bad = write(tmp_path, "plan: t\nops: [\n")
    good = write(tmp_path, HEADER + "outputs: [y]\nops:\n  - y: gemm(x, w)\n", "good.yaml")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    r = subprocess.run([sys.executable, "-m", "planner", "validate", str(bad)], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "error[yaml]" in r.stderr
    r = subprocess.run([sys.executable, "-m", "planner", "validate", str(good)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "planner", "compile", str(bad), "--emit", "json"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 2
    data = json.loads(r.stdout)
    assert data["ok"] is False and data["errors"][0]["line"] >= 2 and data["errors"][0]["code"] == "yaml"


def test_bad_usage_under_emit_json_is_a_json_error(tmp_path, capsys):
    """A consumer of --emit json reads one JSON document on stdout for argument errors too (they
    came as argparse's usage text on stderr, stdout empty); without --emit json they still do."""
    from planner.cli import main
    good = write(tmp_path, HEADER + "outputs: [y]\nops:\n  - y: gemm(x, w)\n")
    for argv in (["compile", str(good), "--streams", "two", "--emit", "json"],
                 ["run", str(good), "--emit=json", "--seed", "x"], ["validate", "--emit", "json"],
                 ["compile", str(good), "--streams", "two", "--emi", "json"], ["run", str(good), "--em=json", "--seed", "x"]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        data = json.loads(out)
        assert data["ok"] is False and data["errors"][0]["code"] == "param" and err == ""
    assert main(["compile", str(good), "--streams", "two"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "usage: planner compile" in err and "invalid int value: 'two'" in err


def test_located_message_format(tmp_path):
    err = error(tmp_path, "outputs: [y]\nops:\n  - y, z: split(x, [48, 15])\n")
    text = err.diagnostics[0].format()
    assert text.startswith(f"{tmp_path / 'plan.yaml'}:16:20: error[shape]: ")


def test_limits_big_and_deep(tmp_path):
    laughs = "a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"a{i}: &a{i} [{', '.join(['*a' + (str(i - 1) if i > 1 else '')] * 9)}]\n" for i in range(1, 12))
    err = error(tmp_path, "", header="plan: t\n" + laughs)
    assert err.code == "limit"
    deep = "plan: t\nparams:\n  x: " + "[" * 500 + "]" * 500 + "\n"
    p = write(tmp_path, deep, "deep.yaml")
    assert main(["validate", str(p)]) == 2
    nested = "plan: t\nparams:\n" + textwrap.indent("".join("  " * i + f"k{i}:\n" for i in range(100)), "  ")
    p = write(tmp_path, nested, "nested.yaml")
    assert main(["validate", str(p)]) == 2


def test_variant_outputs_must_agree(tmp_path):
    err = error(tmp_path, """outputs: [y]
variants:
  - name: a
    when: num_tokens < 4
    ops: [{y: 'gemm(x, w)'}]
  - name: b
    ops: [{y: 'gemm(x, w2)'}]
""")
    assert err.code == "variant" and "variant 'b' gives 'y' as [num_tokens, 16]" in str(err)


def test_rank_varying_gate_on_collectives_is_refused(tmp_path):
    err = error(tmp_path, """outputs: [y]
variants:
  - name: a
    when: contiguous(x)
    ops: [{y: 'all_gather(x, tp)'}]
  - name: b
    ops: [{y: 'all_gather(copy(x), tp)'}]
""")
    assert err.code == "variant" and "differ between ranks" in str(err)


def test_flow_mapping_comma_hint(tmp_path):
    err = error(tmp_path, "outputs: [y]\nops:\n  - {y: gemm(x, w)}\n")
    assert "quote the call" in err.diagnostics[0].hint


@pytest.mark.parametrize("call, code, words, value", [
    ("extern(f, x, shape=[num_tokens, 8], cost_us=-5)", "type", "cost_us must be >= 0", "-5"),
    ("extern(f, x, shape=[num_tokens, 8], cost_us='-5')", "type", "cost_us must be >= 0", "'-5'"),
    ("extern(f, x, shape=[num_tokens, 8], cost_us='nan')", "type", "finite number", "'nan'"),
    ("extern(f, x, shape=[num_tokens, 8], cost_us='1e9999')", "type", "finite number", "'1e9999'"),
    ("extern(f, x, shape=[num_tokens, 8], cost_us=2, side_stream=false, stream=aux)", "stream",
     "side_stream=false", "aux"),
])
def test_extern_cost_and_stream_conflicts(tmp_path, call, code, words, value):
    """A negative, NaN or infinite cost_us and a side_stream=false extern pinned off main are
    located errors (they used to reach the cost model: negative gains, NaN estimates, JSON
    `Infinity`, or model code on a side stream against its declaration)."""
    line = f"  - y: {call}\n"
    err = error(tmp_path, "outputs: [y]\nops:\n" + line)
    d = err.diagnostics[0]
    assert d.code == code and words in d.message, d.format()
    assert d.loc.col == line.rindex(value) + 1, d.format()  # at the offending value


def test_integer_expression_is_a_number(tmp_path):
    """cost_us=-5 written unquoted and cost_us=hidden // 2 evaluate (no 'must be a number')."""
    from tests.planutil import load

    plan = load(tmp_path, "outputs: [y]\nops:\n  - y: extern(f, x, shape=[num_tokens, 8], cost_us=8 // 2)\n")
    assert plan.op("y").cost_us == 4.0


def test_rank_varying_gate_message_names_every_rank_varying_fact(tmp_path):
    err = error(tmp_path, """outputs: [y]
variants:
  - name: a
    when: contiguous(x) and rank == 0
    ops: [{y: 'all_gather(x, tp)'}]
  - name: b
    ops: [{y: 'all_gather(copy(x), tp)'}]
""")
    assert "uses contiguous and rank, which can differ between ranks" in str(err)
