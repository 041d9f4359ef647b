"""Regions nested in variants: dce drops a region with the variant it sits in, the estimate lists
each combination once (no region of a variant not picked), and a nested variant is judged where
its enclosing variants run."""

from planner.analysis import eager_only, never_running, variant_picks, why_never
from planner.config import CompileConfig
from planner.pipeline import compile_plan
from planner.report import to_json, to_text
from tests.planutil import compiled

H = """
plan: t
params: {big: false}
dims: {num_tokens: 1..32}
tuned: {lim: 8}
inputs:
  x: bf16[num_tokens, 16]
weights:
  w: bf16[16, 16]
  v: bf16[16, 16]
"""


def body(outer_gate: str, inner_gate: str = "num_tokens <= tuned.lim") -> str:
    return f"""
outputs: [g]
ops:
  - region: r
    outputs: [g]
    variants:
      - name: fast
        when: {outer_gate}
        ops:
          - region: inner
            outputs: [h]
            variants:
              - name: small
                when: {inner_gate}
                ops:
                  - h: gemm(x, w)
              - name: other
                ops:
                  - h: gemm(x, v)
          - g: copy(h)
      - name: slow
        ops:
          - g: gemm(x, v)
"""


def test_dce_drops_a_region_inside_a_removed_variant(tmp_path):
    cp = compiled(tmp_path, body("num_tokens <= 4"), H)
    assert set(cp.variants) == {"r", "r/fast/inner"}  # before: both live when 'fast' can run
    cp = compiled(tmp_path, body("big"), H)
    assert set(cp.variants) == {"r"} and [v.name for v in cp.variants["r"]] == ["slow"]
    assert cp.report["dce:regions"] == {"r/fast/inner": {"region": "r", "variant": "fast"}}
    assert "r/fast/inner: removed with variant 'fast' of region r" in cp.report["dce"]
    assert not any(n.startswith("r/fast/") for n in cp.graph)
    rows = {(v["region"], v["name"]): v["live"] for v in to_json(cp, CompileConfig())["variants"]}
    assert rows[("r/fast/inner", "small")] is False and rows[("r", "slow")] is True
    assert "[removed with variant 'fast' of region r]" in to_text(cp, CompileConfig(), color=False)
    # the estimate and memory tables name only what can run
    assert [label for label, _, _ in variant_picks(cp)] == ["slow"]
    assert list(cp.report["estimate-memory"]["variants"]) == ["slow"]


def test_each_combination_once_and_without_regions_of_a_variant_not_picked(tmp_path):
    cp = compiled(tmp_path, body("num_tokens <= 4"), H)
    picks = variant_picks(cp)
    labels = [label for label, _, _ in picks]
    assert labels == ["r=fast, r/fast/inner=small", "r=fast, r/fast/inner=other", "r=slow"]
    assert dict(picks[2][1]) == {"r": "slow"}
    mem = cp.report["estimate-memory"]["variants"]
    # 'other' inside 'fast' never runs (fast takes num_tokens <= 4, small all of those)
    assert set(mem) == {"r=fast, r/fast/inner=small", "r=slow"}
    assert mem["r=slow"]["bindings"]["num_tokens"] == 32  # not held to 'small''s num_tokens <= 8


def test_a_nested_variant_is_judged_where_its_enclosing_variant_runs(tmp_path):
    cp = compiled(tmp_path, body("num_tokens <= 4"), H)
    why = why_never(cp, "r/fast/inner", "other", cp.plan.tuned)
    assert why == ("every size where its gate holds while variant 'fast' of region r runs is taken by"
                   " 'small' before it")
    assert why_never(cp, "r/fast/inner", "small", cp.plan.tuned) is None
    # with the limit below fast's sizes, both inner variants run
    cp = compile_plan(cp.plan, CompileConfig(tuned={"lim": 2}))
    assert why_never(cp, "r/fast/inner", "other", {"lim": 2}) is None
    assert never_running(cp, {"lim": 2}) == {}


def test_a_capture_gate_inside_a_capture_gate(tmp_path):
    cp = compiled(tmp_path, body("capturing", "not capturing"), H)
    assert never_running(cp, cp.plan.tuned) == {
        ("r/fast/inner", "small"): "its gate holds in no call where variant 'fast' of region r runs"}
    text = to_text(cp, CompileConfig(), color=False)
    assert "never runs: its gate holds in no call where variant 'fast' of region r runs" in text
    # inside an eager-only variant the same gate always holds: the fallback after it never runs
    cp = compiled(tmp_path, body("not capturing", "not capturing"), H)
    assert never_running(cp, cp.plan.tuned) == {
        ("r/fast/inner", "other"): "every size where its gate holds while variant 'fast' of region r runs"
                                   " is taken by 'small' before it"}


def test_a_variant_that_runs_only_between_buckets_is_not_called_dead(tmp_path):
    """Gates num_tokens >= 8 and <= 4 leave 5..7 to the fallback: no bucket (1, 2, 4, 8, ...) reaches
    it, but eager calls there do (validate warned it never runs)."""
    cp = compiled(tmp_path, """
outputs: [y]
ops:
  - region: comm
    outputs: [y]
    variants:
      - name: big
        when: num_tokens >= 8
        ops:
          - y: copy(x)
      - name: small
        when: num_tokens <= 4
        ops:
          - y: add(x, x)
      - name: plain
        ops:
          - y: gemm(x, w)
""", H)
    assert never_running(cp, {}) == {}
    assert eager_only(cp, {}) == {("comm", "plain"): [5, 6, 7]}
    text = to_text(cp, CompileConfig(), color=False)
    assert "plain          when fallback  [eager calls only: num_tokens = 5..7, between the buckets" in text
    rows = {v["name"]: v for v in to_json(cp, CompileConfig())["variants"]}
    assert rows["plain"]["eager_only_sizes"] == [5, 6, 7] and rows["plain"]["never_runs"] is None
    assert rows["big"]["eager_only_sizes"] is None
    # the estimate and memory tables say so too, and size it where eager calls reach it
    assert "plain: runs only in eager calls, at num_tokens = 5..7 between the buckets" in text
    assert "never runs" not in text
    mem = cp.report["estimate-memory"]["variants"]["plain"]
    assert mem["eager_only"] and mem["bindings"]["num_tokens"] == 7 and "never_runs" not in mem
