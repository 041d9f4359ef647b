"""Messages that said the wrong thing or too little: top-level variants beside ops making an
output, ops that loops expand to nothing, explicit buckets short of the range, control
characters, tuning files named twice or accepted with unknown backends, regions or variants, long-form
op fields in pydantic's words, --bucket-cap-mb out of range, repeated or missing outputs.
Each is a located error with exit 2."""

from __future__ import annotations

import json

import pytest

from planner.cli import main
from tests.planutil import HEADER, PLANS, diagnostic, load, write

# the shared header with a square weight: 12 lines, so a body's first line is line 13
H = HEADER.replace("  w: bf16[32, hidden]\n  w2: bf16[16, hidden]\n", "  w: bf16[hidden, hidden]\n")
KDA = str(PLANS / "k3_kda_projection.yaml")

TOP_VARIANTS = """
outputs: [y]
variants:
  - name: a
    when: num_tokens <= 4
    ops:
      - t: gemm(x, w)
  - name: b
    ops:
      - t: copy(x)
ops:
  - y: add(t, x)
"""


def test_top_level_ops_making_an_output_beside_variants_say_so(tmp_path):
    d = diagnostic(tmp_path, TOP_VARIANTS, H)
    assert d.code == "variant" and "'y' is one of the plan's outputs" in d.message, d.message
    assert "defined twice" not in d.message and "region" in (d.hint or "")
    assert (d.loc.line, d.loc.col) == (24, 5)  # the op, not the plan's first line
    # what the variants read, top-level ops may make
    body = TOP_VARIANTS.replace("- t: gemm(x, w)", "- y: gemm(t, w)").replace("- t: copy(x)", "- y: copy(t)") \
        .replace("- y: add(t, x)", "- t: add(x, x)")
    assert load(tmp_path, body, H).outputs == ["y"]


LOOPED = """
plan: l
params:
  num_layers: 2
dims:
  num_tokens: 1..16
inputs:
  x: bf16[num_tokens, 64]
outputs: [x]
ops:
  - for: L in range(num_layers)
    ops:
      - y{L}: copy(x)
"""


def test_ops_that_loops_expand_to_nothing_name_the_loop(tmp_path, capsys):
    p = write(tmp_path, LOOPED)
    assert main(["validate", str(p), "--set", "num_layers=0"]) == 2
    err = capsys.readouterr().err
    assert f"{p}:10:10: error[schema]: the plan's ops expand to nothing: 'for: L in range(num_layers)'" \
           " runs over [] (num_layers = 0)" in err, err
    assert "no 'ops'" not in err and "Traceback" not in err


def test_an_inner_empty_loop_is_the_one_named(tmp_path):
    body = LOOPED.replace("      - y{L}: copy(x)\n", "      - for: M in range(num_layers - 2)\n"
                                                    "        ops:\n          - y{L}_{M}: copy(x)\n")
    d = diagnostic(tmp_path, body, "")
    assert "'for: M in range(num_layers - 2)' runs over []" in d.message and d.loc.line == 12
    d = diagnostic(tmp_path, LOOPED.replace("range(num_layers)", "[1, 2]").replace("      - y{L}: copy(x)\n", "")
                   .replace("    ops:\n", "    ops: []\n"), "")
    assert "runs over [1, 2] but its 'ops' make nothing" in d.message


def test_buckets_short_of_the_range_name_the_largest(tmp_path):
    header = H.replace("num_tokens: 1..16", "num_tokens: {range: 1..16, buckets: [1, 8, 4]}")
    d = diagnostic(tmp_path, "outputs: [y]\nops:\n  - y: copy(x)\n", header)
    assert "must include its maximum 16 (the largest is 8: sizes 9..16" in d.message, d.message
    assert "last" not in d.message
    # buckets are a set: order and repeats do not matter
    header = H.replace("num_tokens: 1..16", "num_tokens: {range: 1..16, buckets: [8, 1, 16, 16]}")
    assert load(tmp_path, "outputs: [y]\nops:\n  - y: copy(x)\n", header).dims["num_tokens"].buckets == [1, 8, 16]


def test_a_nul_byte_is_located_in_plain_words(tmp_path):
    p = tmp_path / "nul.yaml"
    p.write_bytes(b"plan: p\ndims:\n  num_tokens: 1..16\ninputs:\n  x: bf16[num_tokens, 64]\noutputs: [y]\n"
                  b"ops:\n  - y: copy(\xc3\xa9x)\x00\n")
    with pytest.raises(Exception) as ei:
        from planner.lang.loader import load_plan
        load_plan(p)
    d = ei.value.diagnostics[0]
    assert d.code == "yaml" and "U+0000 (NUL)" in d.message, d.message
    assert "position" not in d.message and "unicode string" not in d.message
    assert (d.loc.line, d.loc.col) == (8, 16)  # a character column, though libyaml counts bytes


@pytest.mark.parametrize("content, want", [
    ({"measured": {"gemm:bf16:M=8,N=60,K=2048": -3.0}}, "measured['gemm:bf16:M=8,N=60,K=2048'] must be"),
    ({"limits": {"nope": 3}}, "declares no tuned limit 'nope'"),
    ('{"limits": {"a": 1, "a": 2}}', "duplicate key 'a'"),
    ('{"limits": {', "cannot read the tuning file"),
])
def test_tuning_file_errors_name_the_file_once(tmp_path, capsys, content, want):
    t = tmp_path / "t.json"
    t.write_text(content if isinstance(content, str) else json.dumps(content))
    assert main(["compile", KDA, "--tuning", str(t)]) == 2
    err = capsys.readouterr().err
    assert f"{t}" in err.split("error[")[0] and want in err and err.count(str(t)) == 1, err


@pytest.mark.parametrize("op, want", [
    ("{op: copy, x: x, out: y, dtype: 7}", "copy: 'dtype' must be a dtype name (got 7); valid: bf16, fp16, fp32"),
    ("{op: gemm, a: x, b: w, out: y, out_dtype: true}", "gemm: 'out_dtype' must be a dtype name (got true); valid:"),
    ("{op: copy, x: x, out: y, stream: 3}", "copy: 'stream' must be a string (got 3)"),
    ("{op: all_reduce, x: x, group: tp, reduce: mean, out: y}", "'reduce' must be 'sum', 'avg', 'max' or 'min'"
                                                                 " (got 'mean')"),
    ("y: copy(x, dtype=7)", "'dtype' must be a dtype name (got 7); valid: bf16"),
])
def test_long_form_fields_of_the_wrong_type_say_what_they_take(tmp_path, op, want):
    d = diagnostic(tmp_path, f"outputs: [y]\nops:\n  - {op}\n", H)
    assert want in d.message and "Input should" not in d.message, d.message
    assert d.loc.line == 15 and d.loc.col > 5  # at the field


def _tuning(tmp_path, **kw):
    t = tmp_path / "t.json"
    t.write_text(json.dumps({"device": "x", "date": "2026", "torch": "2", "limits": {}, "backends": {},
                             "measured": {}, "variants": {}, **kw}))
    return t


@pytest.mark.parametrize("kw, want", [
    ({"variants": {"nope": {"8": {"packed": 1.0}}}},
     "variants['nope']: plan 'k3_kda_projection' has no region 'nope' (regions: kda_projection.0)"),
    ({"variants": {"kda_projection.0": {"8": {"zz": 1.0}}}},
     "region 'kda_projection.0' has no variant 'zz' (variants: two_branch, packed)"),
])
def test_tuning_files_with_unknown_regions_or_variants_are_refused(tmp_path, capsys, kw, want):
    t = _tuning(tmp_path, **kw)
    assert main(["compile", KDA, "--tuning", str(t)]) == 2
    err = capsys.readouterr().err
    assert f"{t}: error[schema]: " in err and want in err, err


@pytest.mark.parametrize("backend", ["warp_drive", "flashinfer:warp"])
def test_tuned_backends_are_checked_against_the_registry(tmp_path, capsys, backend):
    # the registry is extensible, so the executor (not the planner) knows the names
    from executors.errors import BuildError
    from executors.tuning import resolve_tuning
    from planner.lang.loader import load_plan
    from planner.pipeline import compile_plan
    sig = "gemm:bf16:M=16,N=6144,K=7168"
    t = _tuning(tmp_path, backends={sig: {"backend": backend, "config": None}})
    cp = compile_plan(load_plan(KDA))
    with pytest.raises(BuildError, match=rf"{t}: backends\['{sig}'\].backend '{backend}' is not a gemm backend"
                                         r" \(known: .*flashinfer:cudnn.*torch\)"):
        resolve_tuning(cp, str(t), None)
    assert main(["run", KDA, "--set", "tp_size=1", "--tuning", str(t)]) == 2
    err = capsys.readouterr().err
    assert f"{t}: error[schema]: backends['{sig}'].backend '{backend}' is not a gemm backend" in err, err


@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_bucket_cap_is_range_checked(capsys, value):
    assert main(["compile", KDA, f"--bucket-cap-mb={value}"]) == 2
    assert "--bucket-cap-mb must be a finite number > 0" in capsys.readouterr().err


def test_an_output_listed_twice_is_a_located_dup(tmp_path):
    d = diagnostic(tmp_path, "outputs: [y, y]\nops:\n  - y: copy(x)\n", H)
    assert d.code == "dup" and "output 'y' is listed twice (first at 13:11)" in d.message, d.message
    assert (d.loc.line, d.loc.col) == (13, 14)


@pytest.mark.parametrize("outputs", ["outputs: []\n", ""])
def test_a_plan_needs_an_output(tmp_path, outputs):
    d = diagnostic(tmp_path, outputs + "ops:\n  - y: copy(x)\n", H)
    assert d.code == "schema" and "a plan needs at least one output" in d.message, d.message
    assert d.loc.line == (13 if outputs else 1)


def test_a_tuned_limit_of_zero_that_a_gate_divides_by_is_refused_where_the_tuning_is_read(tmp_path, capsys):
    from executors.errors import BuildError
    from executors.lowering import build_executor
    from planner.pipeline import compile_plan
    head = HEADER.replace("dims:", "tuned:\n  div: 4\ndims:")
    body = ("outputs: [y]\nops:\n  - region: r\n    outputs: [y]\n    variants:\n      - name: q\n"
            "        when: num_tokens // tuned.div >= 2\n        ops:\n          - y: copy(x)\n"
            "      - name: p\n        ops:\n          - y: add(x, x)\n")
    p = write(tmp_path, head.lstrip("\n") + body)
    t = _tuning(tmp_path, limits={"div": 0})
    assert main(["compile", str(p), "--tuning", str(t)]) == 2
    err = capsys.readouterr().err
    assert "limits.div: 0, but the gate of variant 'q' of region 'r'" in err and "divides by tuned.div" in err, err
    with pytest.raises(BuildError, match="divides by tuned.div"):
        import torch
        w = {"w": torch.zeros(32, 64).bfloat16(), "w2": torch.zeros(16, 64).bfloat16()}
        build_executor(compile_plan(load(tmp_path / "b", body, head, tp_size=1)), w, device="cpu", tuning=str(t))
    assert main(["compile", str(p), "--tuning", str(_tuning(tmp_path, limits={"div": 2}))]) == 0
