"""How many streams a plan gets: its `streams:` list, or the pool streams it pins, unless
`--streams N` bounds them; a pin that a bound folds onto main is a warning with its location in
compile, run and viz (and validate, which has no bound, folds nothing)."""

import pytest

from planner.cli import main
from planner.config import CompileConfig
from tests.planutil import HEADER, compiled, error, write
from tests.test_stream_planning import ROUTER, SHARED, H, body, streams

PINNED = SHARED.replace("cost_us=2)", "cost_us=2, stream={s})")


def _text(pin, declared=None):
    head = f"streams: [{', '.join(declared)}]\n" if declared else ""
    return H.lstrip("\n") + head + body(PINNED.format(s=pin), ROUTER)


def test_declared_streams_are_all_used_without_a_bound(tmp_path):
    cp = compiled(tmp_path, "streams: [main, a, b, c]\n" + body(PINNED.format(s="c"), ROUTER), H)
    assert cp.streams == ["main", "a", "b", "c"] and streams(cp)["act"] == "c"
    assert not cp.report["assign-streams:folded"]


@pytest.mark.parametrize("pin, want", [("aux3", ["main", "aux1", "aux2", "aux3"]), ("aux1", ["main", "aux"]),
                                       ("aux", ["main", "aux"]), ("main", ["main", "aux"])])
def test_pool_pins_size_the_pool(tmp_path, pin, want):
    cp = compiled(tmp_path, body(PINNED.format(s=pin), ROUTER), H)
    assert cp.streams == want
    assert streams(cp)["act"] == {"aux1": "aux"}.get(pin, pin)


def test_a_bound_folds_and_says_so_with_the_location(tmp_path):
    cp = compiled(tmp_path, body(PINNED.format(s="aux3"), ROUTER), H, cfg=CompileConfig(num_streams=2))
    assert streams(cp)["act"] == "main"
    (f,) = cp.report["assign-streams:folded"]
    assert f["text"] == "act pinned to aux3 -> main (--streams 2 allows main, aux)"
    assert f["loc"].endswith("plan.yaml:14:10"), f["loc"]


def test_cli_warns_of_folds_in_compile_run_and_viz_but_validate_folds_nothing(tmp_path, capsys):
    p = write(tmp_path, _text("side", ["main", "side", "comm"]))
    assert main(["validate", str(p)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["compile", str(p)]) == 0
    assert "warning" not in capsys.readouterr().err
    for argv in (["compile", str(p), "--streams", "1"],
                 ["viz", str(p), "--streams", "1", "-o", str(tmp_path / "g.dot")]):
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert f"warning: {p}:15:10: act pinned to side -> main (--streams 1 allows main)" in err, err
    p = write(tmp_path, HEADER + "streams: [main, side]\noutputs: [a, b]\nops:\n"
              "  - a: gemm(x, w)\n  - b: gemm(x, w2, stream=side)\n", "run.yaml")
    assert main(["run", str(p), "--streams", "1", "--check", "--num-tokens", "3"]) == 0
    out = capsys.readouterr()
    assert "b pinned to side -> main" in out.err and "result: OK" in out.out
    assert main(["viz", str(p), "--streams", "0"]) == 2
    assert "--streams must be 1..64, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("pin, want", [("aux0", "stream 'aux0' is not declared"),
                                       ("aux64", "stream 'aux64' is beyond the pool: a plan may use 64 streams")])
def test_pool_names_outside_the_pool_are_located_errors(tmp_path, pin, want):
    e = error(tmp_path, body(PINNED.format(s=pin), ROUTER), H)
    d = e.diagnostics[0]
    assert want in d.message and d.loc.line == 14, (d.message, d.loc)


def test_more_declared_streams_than_a_gpu_takes(tmp_path):
    names = ["main"] + [f"s{i}" for i in range(64)]
    e = error(tmp_path, f"streams: [{', '.join(names)}]\n" + body(SHARED, ROUTER), H)
    assert "a plan may declare 64 streams at most" in e.diagnostics[0].message


EFFECTS = """
plan: p
dims:
  num_tokens: 1..16
inputs:
  h: bf16[num_tokens, 4096]
weights:
  w: bf16[4096, 4096]
outputs: [o1, o2]
ops:
""" + "".join(f"""  - region: r{i}
    outputs: [o{i}]
    variants:
      - name: a
        when: num_tokens <= 8
        ops:
          - g{i}: gemm(h, w, stream=main)
          - e{i}: extern(kv{i}, h, shape=[num_tokens, 4096], cost_us=50{flag})
          - o{i}: add(g{i}, e{i})
      - name: b
        ops:
          - o{i}: copy(h)
""" for i, flag in ((1, ""), (2, ", effects=true")))


def test_a_scope_like_another_but_for_an_effects_extern_is_planned_on_its_own(tmp_path):
    cp = compiled(tmp_path, EFFECTS, "")
    st = streams(cp)
    assert st["r1/a/e1"] == "aux" and st["r2/a/e2"] == "main", st


def test_a_folded_pin_of_a_fused_all_reduce_and_norm_names_the_all_reduce(tmp_path, capsys):
    head = HEADER.replace("  w2: bf16[16, hidden]\n", "  w2: bf16[16, hidden]\n  n: bf16[hidden]\n")
    p = write(tmp_path, head.lstrip("\n") + "outputs: [y, r]\nops:\n  - a: all_reduce(x, tp, stream=aux2)\n"
              "  - rr: copy(x)\n  - y, r: add_rmsnorm(a, rr, n)\n")
    assert main(["compile", str(p), "--streams", "2"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {p}:17:" in err and "pinned to aux2 -> main" in err, err


GATED_PIN = """
outputs: [y]
variants:
  - name: wide
    when: tp_size == {tp}
    ops:
      - a: gemm(x, w, stream=aux3)
      - y: add(a, a)
  - name: narrow
    ops:
      - y: gemm(x, w)
"""


@pytest.mark.parametrize("tp, want", [(8, ["main", "aux"]), (2, ["main", "aux1", "aux2", "aux3"])])
def test_pins_in_variants_dce_removes_do_not_size_the_pool(tmp_path, tp, want):
    # tp_size is 2: at tp == 8 the first variant's gate folds to false, and its aux3 pin with it
    assert compiled(tmp_path, GATED_PIN.format(tp=tp)).streams == want
