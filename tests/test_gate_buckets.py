"""Which buckets a gated scope is rated and sized at (planner.analysis.allowed_buckets /
largest_bucket): every dim a gate names is walked, and a variant never sees the sizes that a
variant before it always takes."""

from __future__ import annotations

from planner.analysis import allowed_buckets, largest_bucket
from tests.planutil import compiled

TWO_DIMS = """
plan: t
params: {hidden: 256}
dims:
  num_tokens: 1..256
  num_seqs: 1..256
inputs:
  x: bf16[num_tokens, hidden]
  s: bf16[num_seqs, hidden]
weights:
  w: bf16[hidden, hidden]
"""


def _ctx(cp, region, variant):
    return ((region, variant),)


def test_a_gate_on_a_second_dim_is_walked(tmp_path):
    cp = compiled(tmp_path, """
outputs: [y, z]
ops:
  - y: gemm(x, w)
  - region: r
    outputs: [z]
    variants:
      - name: few_seqs
        when: num_seqs <= 4
        ops:
          - z: gemm(s, w)
      - name: many_seqs
        ops:
          - z0: gemm(s, w)
          - z: add(z0, s)
""", header=TWO_DIMS)
    few = allowed_buckets(cp, _ctx(cp, "r", "few_seqs"), {})
    assert {b["num_seqs"] for b in few} == {1, 2, 4}
    assert {b["num_tokens"] for b in few} == set(cp.plan.dims["num_tokens"].buckets)
    assert largest_bucket(cp, _ctx(cp, "r", "few_seqs"), {}) == {"num_tokens": 256, "num_seqs": 4}
    many = allowed_buckets(cp, _ctx(cp, "r", "many_seqs"), {})
    assert min(b["num_seqs"] for b in many) == 8  # the fallback never sees 1..4 sequences
    assert largest_bucket(cp, _ctx(cp, "r", "many_seqs"), {})["num_seqs"] == 256
    # scopes without gates keep the old walk: the first dim only, the others at their maximum
    assert {b["num_seqs"] for b in allowed_buckets(cp, (), {})} == {256}
    mem = cp.report["estimate-memory"]["variants"]
    assert mem["few_seqs"]["bindings"] == {"num_tokens": 256, "num_seqs": 4}, mem
    assert mem["many_seqs"]["bindings"] == {"num_tokens": 256, "num_seqs": 256}, mem


def test_fallback_is_rated_only_where_it_runs(tmp_path, capsys):
    body = """
outputs: [y]
ops:
  - region: r
    outputs: [y]
    variants:
      - name: small
        when: {gate}
        ops:
          - y: copy(x)
      - name: large
        ops:
          - e: gemm(x, w)
          - y: add(x, x)
"""
    hdr = """
plan: t
params: {hidden: 64}
dims:
  num_tokens: 1..1024
inputs:
  x: bf16[num_tokens, hidden]
weights:
  w: bf16[hidden, hidden]
"""
    cp = compiled(tmp_path / "a", body.replace("{gate}", "num_tokens <= 64"), header=hdr)
    toks = [b["num_tokens"] for b in allowed_buckets(cp, _ctx(cp, "r", "large"), {})]
    assert min(toks) == 128 and max(toks) == 1024
    # a gate that may or may not hold at run time (capturing, the device) excludes nothing
    for gate in ("capturing and num_tokens <= 64", "device == 'cuda' and num_tokens <= 64"):
        cp = compiled(tmp_path / gate[:5], body.replace("{gate}", gate), header=hdr)
        toks = [b["num_tokens"] for b in allowed_buckets(cp, _ctx(cp, "r", "large"), {})]
        assert min(toks) == 1, gate
    # the same holds through the report: the fallback's rows start at 128 tokens
    import json

    from planner.cli import main
    from tests.planutil import write

    p = write(tmp_path / "c", hdr.lstrip("\n") + body.replace("{gate}", "num_tokens <= 64"))
    assert main(["compile", str(p), "--emit", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["critical_path"]
    assert min(r["bindings"]["num_tokens"] for r in rows if r["variant"] == "large") == 128
    assert max(r["bindings"]["num_tokens"] for r in rows if r["variant"] == "small") == 64


TWO_REGIONS = """
outputs: [a, c]
ops:
  - region: r1
    outputs: [a]
    variants:
      - name: small
        when: num_tokens <= 8
        ops:
          - a: copy(x)
      - name: big
        ops:
          - a0: gemm(x, w)
          - a: add(a0, x)
  - region: r2
    outputs: [c]
    variants:
      - name: small
        when: num_tokens <= 32
        ops:
          - c: copy(a)
      - name: big
        ops:
          - c0: gemm(a, w)
          - c: add(c0, a)
"""
HDR = """
plan: t
params: {hidden: 64}
dims:
  num_tokens: 1..256
inputs:
  x: bf16[num_tokens, hidden]
weights:
  w: bf16[hidden, hidden]
"""


def test_regions_with_different_gates_are_not_merged_and_every_combination_is_estimated(tmp_path):
    from planner.config import CompileConfig
    from planner.report import critical_paths, to_text

    cp = compiled(tmp_path, TWO_REGIONS, header=HDR)
    text = to_text(cp, CompileConfig())
    assert "region r1:" in text and "region r2:" in text and "alike" not in text
    rows = critical_paths(cp, CompileConfig())
    seen = {}
    for r in rows:
        seen.setdefault(r["variant"], []).append(r["bindings"]["num_tokens"])
    # 9..32 tokens run r1=big with r2=small: estimated; r1=small with r2=big never runs together
    assert seen == {"r1=small, r2=small": [1, 4, 8], "r1=big, r2=small": [16, 32],
                    "r1=big, r2=big": [64, 128, 256]}, seen


def test_memory_of_differing_regions_is_per_combination_that_runs(tmp_path):
    cp = compiled(tmp_path, TWO_REGIONS, header=HDR)
    mem = cp.report["estimate-memory"]["variants"]
    # the combinations that run together, each sized at the largest size where it runs (not one
    # variant name across both regions: r1=small with r2=big never runs)
    assert {k: m["bindings"]["num_tokens"] for k, m in mem.items()} == {
        "r1=small, r2=small": 8, "r1=big, r2=small": 32, "r1=big, r2=big": 256}
    assert not any(m.get("never_runs") for m in mem.values())


def test_a_variant_that_never_runs_is_said_so(tmp_path):
    from planner.config import CompileConfig
    from planner.report import critical_paths, to_text

    body = TWO_REGIONS.split("  - region: r2")[0].replace("outputs: [a, c]", "outputs: [a]")
    cp = compiled(tmp_path, body.replace("num_tokens <= 8", "num_tokens <= 0"), header=HDR)
    assert {r["variant"] for r in critical_paths(cp, CompileConfig())} == {"big"}
    text = to_text(cp, CompileConfig())
    assert "small: never runs: its gate holds at no size the dims allow" in text
    assert "[never runs: its gate holds at no size the dims allow]" in text  # in the Variants section too


SHADOWED = """
outputs: [y]
ops:
  - region: r
    outputs: [y]
    variants:
      - name: small
        when: num_tokens <= 16
        ops:
          - y: gemm(x, w)
      - name: tiny
        when: num_tokens <= 8
        ops:
          - y: copy(x)
      - name: big
        ops:
          - y: add(x, x)
"""


def test_a_variant_shadowed_by_an_earlier_one_is_named(tmp_path, capsys):
    from planner.cli import main
    from planner.config import CompileConfig
    from planner.report import to_text
    from tests.planutil import write

    cp = compiled(tmp_path, SHADOWED, header=HDR)
    text = to_text(cp, CompileConfig())
    assert "tiny: never runs: every size where its gate holds is taken by 'small' before it" in text
    mem = cp.report["estimate-memory"]["variants"]
    assert mem["tiny"].get("never_runs") and not mem["small"].get("never_runs")
    p = write(tmp_path, HDR.lstrip("\n") + SHADOWED, "shadowed.yaml")
    assert main(["validate", str(p)]) == 0  # a warning, not an error
    err = capsys.readouterr().err
    assert f"warning: {p}:" in err and "variant 'tiny' of region r never runs" in err and "'small'" in err


def test_a_variant_gated_on_eager_calls_or_the_device_runs(tmp_path):
    """A gate that holds outside a capture (or on the CPU) runs there: it is not 'never runs'."""
    from planner.analysis import never_running

    for gate in ("not capturing", "device == 'cpu'", "cc == 0", "not capturing and num_tokens <= 8"):
        cp = compiled(tmp_path, SHADOWED.replace("num_tokens <= 16", gate), header=HDR)
        never = never_running(cp, cp.plan.tuned)
        assert ("r", "small") not in never, (gate, never)
        assert not cp.report["estimate-memory"]["variants"]["small"].get("never_runs"), gate
    cp = compiled(tmp_path, SHADOWED.replace("num_tokens <= 16", "capturing and device == 'cpu'"), header=HDR)
    assert never_running(cp, cp.plan.tuned)[("r", "small")] == "its gate holds at no size the dims allow"


TWO_CALL_REGIONS = """
outputs: [y, z]
ops:
  - region: r1
    outputs: [y]
    variants:
      - name: eager1
        when: not capturing
        ops:
          - y: gemm(x, w)
      - name: graph1
        ops:
          - y: copy(x)
  - region: r2
    outputs: [z]
    variants:
      - name: graph2
        when: capturing
        ops:
          - z: gemm(s, w)
      - name: eager2
        ops:
          - z: copy(s)
"""


def test_variants_of_two_regions_are_judged_in_one_call(tmp_path):
    """'not capturing' in one region and 'capturing' in another never run in one call; nor does the
    fallback of one with the gated variant of the other: neither pair is estimated or sized."""
    from planner.analysis import possible_buckets, variant_picks

    cp = compiled(tmp_path, TWO_CALL_REGIONS, header=TWO_DIMS)
    tuned = cp.plan.tuned
    assert not possible_buckets(cp, (("r1", "eager1"), ("r2", "graph2")), tuned)
    assert not possible_buckets(cp, (("r1", "graph1"), ("r2", "eager2")), tuned)
    assert possible_buckets(cp, (("r1", "eager1"), ("r2", "eager2")), tuned)
    assert possible_buckets(cp, (("r1", "graph1"), ("r2", "graph2")), tuned)
    labels = [label for label, _, _ in variant_picks(cp)]
    assert set(cp.report["estimate-memory"]["variants"]) >= {"r1=eager1, r2=eager2", "r1=graph1, r2=graph2"}, labels
    for label in ("r1=eager1, r2=graph2", "r1=graph1, r2=eager2"):
        assert cp.report["estimate-memory"]["variants"].get(label, {}).get("never_runs", True), label


def test_the_variant_the_planner_optimizes_for_is_the_captured_one(tmp_path):
    """running_variants names what runs in a graph capture on the GPU: a CPU-only first variant is
    not taken for the GPU one (it costed the GPU variant's ops as free)."""
    from planner.analysis import running_variants

    cp = compiled(tmp_path, """
outputs: [y]
ops:
  - region: r1
    outputs: [y]
    variants:
      - name: cpu_path
        when: device == 'cpu'
        ops:
          - y: copy(x)
      - name: gpu_path
        ops:
          - y: gemm(x, w)
""", header=TWO_DIMS)
    for b in ({"num_tokens": 1, "num_seqs": 1}, {"num_tokens": 256, "num_seqs": 256}):
        assert running_variants(cp, b, cp.plan.tuned) == {"r1": "gpu_path"}


def _six_regions(gates):
    ops = []
    for i, gate in enumerate(gates):
        ops.append(f"""  - region: r{i}
    outputs: [y{i}]
    variants:
      - name: fast
        when: {gate}
        ops:
          - y{i}: gemm(x, w)
      - name: slow
        ops:
          - y{i}: copy(x)
""")
    return f"outputs: [{', '.join(f'y{i}' for i in range(len(gates)))}]\nops:\n" + "".join(ops)


def test_one_name_at_a_time_judges_each_region_in_its_own_calls(tmp_path):
    """Past 32 combinations the estimate takes one variant name at a time; 'fast' is a capture
    variant in three regions and an eager one in three others, so no one call runs them all: the
    estimate and the memory table still list it (they went empty)."""
    cp = compiled(tmp_path, _six_regions(["capturing", "not capturing", "capturing and num_tokens > 1",
                                          "not capturing and num_tokens > 2", "capturing and num_tokens > 3",
                                          "not capturing and num_tokens > 4"]),
                  header=TWO_DIMS)
    assert set(cp.report["estimate-memory"]["variants"]) == {"fast", "slow"}
    assert not any(v.get("never_runs") for v in cp.report["estimate-memory"]["variants"].values())
    from planner.config import CompileConfig
    from planner.report import to_text
    text = to_text(cp, CompileConfig())
    assert "  fast  " in text.split("Estimated time per variant")[1].split("Memory")[0], text


def test_a_variant_shadowed_within_its_call_names_the_one_before_it(tmp_path):
    from planner.analysis import never_running
    cp = compiled(tmp_path, """
outputs: [y]
ops:
  - region: r
    outputs: [y]
    variants:
      - name: graph
        when: capturing
        ops:
          - y: gemm(x, w)
      - name: small_graph
        when: capturing and num_tokens <= 64
        ops:
          - y: copy(x)
      - name: eager
        ops:
          - y: add(x, x)
""", header=TWO_DIMS)
    assert never_running(cp, cp.plan.tuned) == {
        ("r", "small_graph"): "every size where its gate holds is taken by 'graph' before it"}
