"""More misuse found by plans written as a new user would write them: gates that cannot be
evaluated or read their own region, YAML merge keys, included files with a plan's sections,
duplicate block arguments, non-ASCII names, malformed tuning files, paths that cannot be written,
unbounded --streams, dims too large to build, an explicit backend that can never run the op.
Each is a located error with exit 2 (or, for what only a call can show, one line with exit 1)."""

from __future__ import annotations

import json
import textwrap

import pytest

from planner.cli import main
from planner.lang.loader import parse_overrides
from planner.pipeline import compile_plan
from tests.planutil import HEADER, PLANS, diagnostic, gated, load, write

# the shared header with a square weight (a gemm variant of the same shape as a copy of x)
H = HEADER.replace("  w: bf16[32, hidden]\n  w2: bf16[16, hidden]\n", "  w: bf16[hidden, hidden]\n")


def _gated(when: str) -> str:
    return gated(when, a_op="y: gemm(x, w)")


def _diag(tmp_path, body, header=H):
    return diagnostic(tmp_path, body, header)


@pytest.mark.parametrize("when, code, want", [
    ("dim(x, 5) > 2", "shape", "'x' has rank 2, so its dims are 0..1"),
    ("dim(x, hidden) > 2", "shape", "dim(x, 64)"),
    ("num_tokens // 0 > 1", "param", "divides by zero"),
    ("ceil_div(num_tokens, 0) > 1", "param", "divides by zero"),
    ("contiguous(y)", "cycle", "which its own region makes"),
    ("dim(y, 0) > 3", "cycle", "which its own region makes"),
])
def test_gates_that_cannot_be_right_are_located(tmp_path, when, code, want):
    d = _diag(tmp_path, _gated(when))
    assert d.code == code and want in d.message, d.message
    assert d.loc is not None and d.loc.line == 20


def test_a_gate_dividing_by_zero_at_run_time_fails_in_one_line(tmp_path, capsys):
    p = write(tmp_path, textwrap.dedent(H).lstrip("\n").replace("groups:\n  tp: tp_size\n", "")
              + textwrap.dedent(_gated("10 // (num_tokens - 3) > 1")))
    assert main(["validate", str(p)]) == 0
    assert main(["run", str(p), "--num-tokens", "3"]) == 1
    out = capsys.readouterr().out
    assert "gate '10 // (num_tokens - 3)' divides by zero at num_tokens=3" in out


def test_world_size_gates_are_judged_at_the_plans_world(tmp_path):
    plan = load(tmp_path, _gated("world_size == 2"), H)
    from planner.analysis import why_never
    cp = compile_plan(plan)
    assert why_never(cp, "r", "a", {}) is None  # it runs: planner run binds tp_size = 2 ranks


def test_yaml_merge_keys_are_refused_where_written(tmp_path):
    body = "outputs: [y]\nops:\n  - &o {op: copy, x: x, out: y}\n  - <<: *o\n    out: z\n"
    d = _diag(tmp_path, body)
    assert "merge keys" in d.message and d.loc.line == 16


def test_an_included_file_may_not_bring_ops(tmp_path):
    write(tmp_path, "params: {k: 4}\nops:\n  - y: copy(x)\n", "lib.yaml")
    p = write(tmp_path, "plan: m\ninclude: [lib.yaml]\ndims: {num_tokens: 1..4}\n"
                        "inputs:\n  x: bf16[num_tokens, 4]\noutputs: [x]\nops:\n  - z: copy(x)\n")
    with pytest.raises(Exception) as ei:
        from planner.lang.loader import load_plan
        load_plan(p)
    d = ei.value.diagnostics[0]
    assert "an included file contributes only" in d.message and "'ops'" in d.message
    assert d.loc.file.endswith("lib.yaml") and d.loc.line == 2


def test_duplicate_block_args_are_refused(tmp_path):
    body = "blocks:\n  f:\n    args: [a, a]\n    outputs: [y]\n    ops:\n      - y: copy(a)\n" \
           "outputs: [y]\nops:\n  - y: f(x, x)\n"
    d = _diag(tmp_path, body)
    assert d.code == "dup" and "arg 'a' is listed twice" in d.message


def test_non_ascii_tensor_names_are_refused_where_declared(tmp_path):
    d = _diag(tmp_path, "outputs: [y]\nops:\n  - y: copy(x)\n",
              H.replace("  x: bf16[num_tokens, hidden]\n", "  x: bf16[num_tokens, hidden]\n  xé: bf16[4]\n"))
    assert "'xé' is not a valid tensor name" in d.message and d.loc.line == 11


def test_quantize_on_flashinfer_needs_its_group_size(tmp_path):
    d = _diag(tmp_path, "outputs: [q, s]\nops:\n  - q, s: quantize(x, fp8_e4m3, block=[1, 64], backend=flashinfer)\n")
    assert "groups of 128 only" in d.message and d.loc.line == 15


def test_set_takes_lists_and_booleans():
    assert parse_overrides(["a=[1, 2,4]", "b=true", "c=7", "d=text"]) == {"a": [1, 2, 4], "b": True, "c": 7, "d": "text"}
    with pytest.raises(Exception, match="a list value takes integers"):
        parse_overrides(["a=[1, x]"])


@pytest.mark.parametrize("content, code, want", [
    (b"\xff\xfe\x00binary", "io", "not UTF-8"),
    (b'{"limits": {"a": 1, "a": 2}}', "dup", "duplicate key 'a'"),
    (b'{"limits": {"kda_two_branch_max": 99999999999999999999999999}}', "schema", "below 2**63"),
    (b'{"variants": {"kda_projection": [1, 2]}}', "schema", "must be an object"),
    (b'{"limits": {"kda_two_branch_max": 4,}}', "io", "Expecting property name"),
])
def test_malformed_tuning_files_are_located_errors(tmp_path, capsys, content, code, want):
    t = tmp_path / "t.json"
    t.write_bytes(content)
    rc = main(["compile", str(PLANS / "k3_kda_projection.yaml"), "--tuning", str(t), "--emit", "json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 2 and not data["ok"]
    e = data["errors"][0]
    assert e["code"] == code and want in e["message"] and e["file"] == str(t), e


@pytest.mark.parametrize("cmd", [["compile", "-o", "{dir}"], ["viz", "-o", "{dir}/x.svg/"], ["compile", "-o", "/proc/x.txt"],
                                 ["compile", "-o", "/proc/no/such/x.txt"], ["viz", "-o", "/proc/no/x.png"]])
def test_unwritable_outputs_are_io_errors(tmp_path, capsys, cmd):
    (tmp_path / "x.svg").mkdir()
    args = [a.replace("{dir}", str(tmp_path)) for a in cmd]
    rc = main([args[0], str(PLANS / "k3_kda_projection.yaml"), *args[1:]])
    err = capsys.readouterr().err
    assert rc == 2 and "error[io]: cannot use" in err and "Traceback" not in err


def test_run_checks_the_timeline_path_first(tmp_path, capsys):
    rc = main(["run", str(PLANS / "k3_sp_tail.yaml"), "--set", "tp_size=1", "--timeline", "/proc/t.png"])
    cap = capsys.readouterr()
    assert rc == 2 and "cannot write the timeline" in cap.err and "result:" not in cap.out


def test_streams_are_bounded(capsys):
    assert main(["compile", str(PLANS / "k3_kda_projection.yaml"), "--streams", "100000"]) == 2
    assert "--streams must be 1..64" in capsys.readouterr().err


def test_a_dim_range_too_large_to_build_exits_2_before_running(tmp_path, capsys):
    p = write(tmp_path, "plan: h\ndims: {num_tokens: 1..9223372036854775807}\ninputs:\n  x: bf16[num_tokens, 64]\n"
                        "weights:\n  w: bf16[64, 64]\noutputs: [y]\nops:\n  - y: gemm(x, w)\n")
    rc = main(["run", str(p), "--check", "--num-tokens", "5"])
    cap = capsys.readouterr()
    assert rc == 2 and "at the dims' largest values" in cap.err and "result:" not in cap.out


def test_set_is_checked_against_choices_before_derived_params(capsys):
    assert main(["validate", str(PLANS / "k3_tp8.yaml"), "--set", "tp_size=abc"]) == 2
    err = capsys.readouterr().err
    assert "param 'tp_size' = 'abc' (--set) is not one of [1, 2, 4, 8]" in err


def test_rank_gates_are_judged_over_every_rank(tmp_path):
    body = _gated("rank == 1").replace("- y: gemm(x, w)", "- y: copy(x)")
    cp = compile_plan(load(tmp_path, body, H))  # no collectives: a rank gate is allowed
    from planner.analysis import why_never
    assert why_never(cp, "r", "a", {}) is None  # rank 1 of the plan's 2 takes it
    cp = compile_plan(load(tmp_path, body.replace("rank == 1", "rank == 5"), H))
    assert why_never(cp, "r", "a", {}) is not None  # no rank of 2 is 5


def test_world_size_gates_without_groups_can_hold(tmp_path):
    header = H.replace("groups:\n  tp: tp_size\n", "")
    cp = compile_plan(load(tmp_path, _gated("rank == 0 and world_size >= 2").replace("gemm(x, w)", "copy(x)"), header))
    from planner.analysis import why_never
    assert why_never(cp, "r", "a", {}) is None  # an embedded executor may run in any world


def test_more_names_and_values_refused_where_written(tmp_path, capsys):
    d = _diag(tmp_path, "outputs: [y]\nops:\n  - yé: copy(x)\n  - y: copy(x)\n")
    assert "'yé' is not a valid tensor name" in d.message
    d = _diag(tmp_path, "streams: [main, cömm]\noutputs: [y]\nops:\n  - y: copy(x)\n")
    assert d.code == "stream" and "cömm" in d.message
    d = _diag(tmp_path, "outputs: [y]\nops:\n  - y: copy(x)\n", H.replace("  hidden: 64\n", "  hidden: 64\n  !!int abc: 1\n"))
    assert d.code == "yaml" and "bad key" in d.message and d.loc.line == 4
    header = H.replace("  x: bf16[num_tokens, hidden]\n", "  x: bf16[num_tokens, hidden]\n  q: bf16[num_tokens, 16]\n"
                       "  pos: int64[num_tokens]\n").replace("  w: bf16[hidden, hidden]\n", "  w: bf16[hidden, hidden]\n"
                                                             "  cs: fp32[0, 16]\n")
    d = _diag(tmp_path, "outputs: [a, b]\nops:\n  - a, b: rope(q, q, pos, cs)\n", header)
    assert "has no rows" in d.message
    with pytest.raises(Exception, match="a list value takes integers"):
        parse_overrides(["a=[1,,2]"])
    assert main(["validate", str(PLANS / "k3_tp8.yaml"), "--set", "tp_size=true"]) == 2
    assert "(--set) is not one of [1, 2, 4, 8]" in capsys.readouterr().err


def test_compile_output_makes_its_folders(tmp_path):
    out = tmp_path / "build" / "k3" / "plan.txt"
    assert main(["compile", str(PLANS / "k3_kda_projection.yaml"), "-o", str(out)]) == 0
    assert "k3_kda_projection" in out.read_text()


STRING_PARAM = """
plan: s
params:
  mode: {value: %s, choices: [fast, slow]}
  other: 2
dims:
  num_tokens: 1..8
inputs:
  x: bf16[num_tokens, 16]
outputs: [y]
ops:
  - y: add(x, x)
"""


@pytest.mark.parametrize("value", ["fast", "\"'fast'\""])
def test_string_param_value_as_written_in_its_choices(tmp_path, value):
    plan = load(tmp_path, STRING_PARAM % value, header="")
    assert plan.params["mode"] == "fast"


def test_string_param_outside_its_choices_is_located(tmp_path):
    d = diagnostic(tmp_path, STRING_PARAM % "slw", header="")
    assert d.code == "param" and "is not one of ['fast', 'slow']" in d.message and "'slow'" in (d.hint or "")
    assert d.loc.line == 3
    # a value naming another param is still that param's value (and then outside the choices)
    d = diagnostic(tmp_path, STRING_PARAM % "other", header="")
    assert "= 2 (value) is not one of" in d.message


def test_include_of_a_directory_says_so(tmp_path):
    (tmp_path / "lib").mkdir()
    d = diagnostic(tmp_path, "include: [lib]\n" + STRING_PARAM % "fast", header="")
    assert d.code == "include" and "is a directory" in d.message
