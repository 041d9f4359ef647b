"""Located errors for a region defined twice, gates that read a non-constant axis or divide with
'/', shapes that fail at some size, and gates over a loop's tensors."""

import pytest

from executors.tools.check import run_check
from planner.lang.loader import load_plan
from tests.planutil import HEADER, compiled, diagnostic, write


def region(rid: str, when: str, out: str = "y") -> str:
    return f"""  - region: {rid}
    outputs: ["{out}"]
    variants:
      - name: a
        when: {when}
        ops:
          - {out}: copy(x)
      - name: b
        ops:
          - {out}: add(x, x)
"""


def test_a_region_defined_twice_is_a_dup_error(tmp_path):
    d = diagnostic(tmp_path, "outputs: [y, z]\nops:\n" + region("r", "num_tokens <= 4")
                   + region("r", "num_tokens == 1", "z"))
    assert d.code == "dup" and "region 'r' is defined twice (first at" in d.message, d
    assert d.loc.line == 26 and "with the loop variable" in d.hint, d
    # a for-loop whose region name forgets the loop variable
    d = diagnostic(tmp_path, "outputs: [y0, y1]\nops:\n  - for: L in [0, 1]\n    ops:\n"
                   + "".join("    " + ln + "\n" for ln in region("r", "num_tokens <= 4", "y{L}").splitlines()))
    assert d.code == "dup" and "region 'r' is defined twice" in d.message, d


@pytest.mark.parametrize("gate, msg", [
    ("dim(x, num_tokens) == 64", "dim(x, num_tokens): the axis must be a constant"),
    ("dim(x, world_size) == 64", "dim(x, world_size): the axis must be a constant"),
    ("num_tokens / 2 == 2", "'num_tokens / 2': '/' must divide exactly, which a gate over sizes cannot promise"),
    ("num_tokens <= 9223372036854775807 * 2", "integer overflow"),
])
def test_gates_that_cannot_be_judged_are_located(tmp_path, gate, msg):
    d = diagnostic(tmp_path, "outputs: [y]\nops:\n" + region("r", gate))
    assert msg in d.message and d.loc is not None and d.loc.line == 20, d


def test_constant_axes_and_floor_division_in_gates_are_fine(tmp_path):
    compiled(tmp_path, "outputs: [y]\nops:\n" + region("r", "dim(x, -1) == 64 and num_tokens // 2 == 2"))
    compiled(tmp_path, "outputs: [y]\nops:\n" + region("r", "dim(x, hidden // 64) == 64"))


@pytest.mark.parametrize("where, dim, msg", [
    ("input", "num_tokens / 2", "dim 'num_tokens / 2' of 'v': 1 / 2 does not divide exactly"),
    ("input", "num_tokens % 0", "of 'v': division by zero"),
    ("extern", "num_tokens / 2", "dim 0 of 'y' (num_tokens / 2): 1 / 2 does not divide exactly"),
    ("extern", "num_tokens % 0", "dim 0 of 'y' (num_tokens % 0): division by zero"),
])
def test_shapes_that_fail_at_some_size_are_located(tmp_path, where, dim, msg):
    if where == "input":
        head, body = HEADER.replace("inputs:\n", f"inputs:\n  v: bf16[{dim}, hidden]\n"), "outputs: [y]\nops:\n  - y: copy(v)\n"
    else:
        head, body = HEADER, f"outputs: [y]\nops:\n  - y: extern(f, x, shape=[{dim}, 64])\n"
    d = diagnostic(tmp_path, body, head)
    assert msg in d.message and d.loc is not None and d.loc.line > 0 and d.loc.col > 0, d


def test_a_gate_in_a_for_loop_names_the_passs_tensors(tmp_path):
    text = HEADER.replace("  x: bf16[num_tokens, hidden]", "  x0: bf16[num_tokens, hidden]\n"
                          "  x1: bf16[num_tokens, hidden]") + """
outputs: [y0, y1]
ops:
  - for: L in [0, 1]
    ops:
      - region: r{L}
        outputs: ["y{L}"]
        variants:
          - name: fast
            when: contiguous(x{L}) and num_tokens <= 4
            ops:
              - y{L}: add(x{L}, x{L})
          - name: slow
            ops:
              - y{L}: add(copy(x{L}), x{L})
"""
    p = write(tmp_path, text)
    plan = load_plan(p)
    assert [v.when_src for v in plan.regions["r1"].variants][0] == "contiguous(x1) and num_tokens <= 4"
    assert run_check(lambda: load_plan(p, {"tp_size": 1}), num_tokens=3)["ok"]


def test_the_in_place_hint_states_the_rule(tmp_path):
    d = diagnostic(tmp_path, "outputs: [y, z, o]\nops:\n  - res: copy(x)\n  - o: add(res, x)\n"
                   "  - s: copy(x)\n  - y, z: add_rmsnorm(s, res, wn, inplace=true)\n",
                   HEADER.replace("weights:\n", "weights:\n  wn: bf16[hidden]\n"))
    assert "an in-place op must be the only reader of what it overwrites" in d.message, d


def test_a_block_call_id_used_twice_is_located_at_the_second_call(tmp_path):
    head = HEADER + """blocks:
  lin:
    args: [x, w]
    outputs: [y]
    ops:
      - t: gemm(x, w)
      - y: copy(t)
"""
    d = diagnostic(tmp_path, "outputs: [y2]\nops:\n  - y1: lin(x, w, id=proj)\n  - y2: lin(y1[:, :32], w, id=proj)\n",
                   head.replace("w: bf16[32, hidden]", "w: bf16[hidden, hidden]"))
    assert d.code == "dup" and "block call id 'proj' is used twice (first at" in d.message, d
    assert (d.loc.line, d.loc.col) == (24, 31), d  # at proj of the second call


def test_columns_inside_a_for_loop_are_the_written_ones(tmp_path):
    """x{L} is read as x0: an error after it was reported 2 columns early per substitution."""
    head = HEADER.replace("  x: bf16[num_tokens, hidden]", "  x0: bf16[num_tokens, hidden]").replace(
        "w: bf16[32, hidden]", "w: bf16[hidden, hidden]")
    body = "outputs: [x2]\nops:\n  - for: L in [0, 1]\n    ops:\n      - x{L + 1}: add(x{L}, gemm(x{L}, ww))\n"
    d = diagnostic(tmp_path, body, head)
    lines = (tmp_path / "plan.yaml").read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if "ww" in ln)
    assert (d.loc.line, d.loc.col) == (at + 1, lines[at].index("ww") + 1), d
    assert "reads undefined tensor 'ww'" in d.message


@pytest.mark.parametrize("value, msg", [("true", "'tuned.lim' must be an integer (found true)"),
                                        ("-3", "'tuned.lim' must be >= 0 (found -3)")])
def test_a_tuned_limit_is_a_non_negative_integer(tmp_path, value, msg):
    """As tuning files hold them: true was read as 1, a negative limit was taken."""
    d = diagnostic(tmp_path, "outputs: [y]\nops:\n  - y: copy(x)\n", HEADER + f"tuned:\n  lim: {value}\n")
    assert msg in d.message and d.loc.line > 0, d


@pytest.mark.parametrize("where", ["region", "variant"])
def test_a_region_or_variant_doc_is_text(tmp_path, where):
    body = "outputs: [y]\nops:\n" + region("r", "num_tokens <= 4")
    body = body.replace("    outputs:", "    doc: [1, 2]\n    outputs:") if where == "region" else \
        body.replace("      - name: a\n", "      - name: a\n        doc: 3\n")
    d = diagnostic(tmp_path, body)
    assert f"a {where}'s 'doc' must be text" in d.message and d.loc.line > 0, d
