"""The check's tolerance follows the precision an output was computed in, not its dtype."""

from __future__ import annotations

import torch

from executors.tools.check import (
    TOLERANCE,
    computed_in,
    outputs_match,
    reference_compiled,
    run_check,
    tolerance,
)
from tests.dist_plans import load_text

PLAN = """
plan: tol
dims:
  num_tokens: 1..16
groups:
  tp: 1
inputs:
  x: bf16[num_tokens, 16]
  z: fp32[num_tokens, 16]
weights:
  w: bf16[16, 16]
  wf: fp32[16, 16]
outputs: [up, moved, cast, wide, mixed]
ops:
  - g: gemm(x, w)
  - up: copy(g, dtype=fp32)           # bf16 arithmetic, returned as fp32
  - moved: copy(x, dtype=fp32)        # data movement (an exact widening)
  - cast: all_gather(up, tp)          # still computed in bf16
  - wide: gemm(z, wf)                 # fp32 arithmetic
  - mixed: add(wide, up)              # fp32 add of a bf16 result: the bf16 rounding bounds it
"""


def _ref():
    return reference_compiled(load_text(PLAN))


def test_computed_in_follows_the_arithmetic_not_the_output_dtype():
    p = computed_in(_ref())
    assert p == {"up": ["bf16"], "moved": [], "cast": ["bf16"], "wide": ["fp32"], "mixed": ["bf16", "fp32"]}
    assert tolerance(p["up"]) == TOLERANCE["bf16"]
    assert tolerance(p["mixed"]) == TOLERANCE["bf16"]
    assert tolerance(p["wide"]) == TOLERANCE["fp32"]
    assert tolerance(p["moved"]) is None


def test_a_bf16_rounding_of_a_cast_output_passes_and_an_fp32_one_does_not():
    torch.manual_seed(0)
    ref = (torch.randn(8, 16) * 16).bfloat16().float()
    # what fusion does to a bf16 sum: the other rounding, one bf16 ulp (0.125 at 16), on some elements
    ulp = torch.exp2(torch.floor(torch.log2(ref.abs())) - 7)
    moved = ref.clone()
    moved[::3] += ulp[::3]
    p = computed_in(_ref())
    assert outputs_match(moved, ref, tolerance(p["up"]))          # computed in bf16: fine
    assert not outputs_match(moved, ref, tolerance(p["wide"]))    # computed in fp32: a real error
    assert not outputs_match(moved, ref, tolerance(p["moved"]))   # data movement: must be exact
    tiny = ref.clone()
    tiny[0, 0] = torch.nextafter(tiny[0, 0], torch.tensor(float("inf")))
    assert not outputs_match(tiny, ref, tolerance(p["moved"]))


def test_run_check_reports_the_precision_and_passes():
    rep = run_check(lambda: load_text(PLAN), num_tokens=5, seed=2)
    assert rep["ok"], rep
    by = {o["name"]: o for o in rep["outputs"]}
    assert by["up"]["dtype"] == "float32" and by["up"]["computed_in"] == ["bf16"] and not by["up"]["exact"]
    assert by["moved"]["exact"] and by["moved"]["max_abs_err"] == 0.0


def test_a_narrowing_cast_rounds_and_a_variant_sending_fp8_passes_its_tolerance():
    """copy(x, dtype=fp8_e4m3) is one fp8 step: a variant that gathers fp8 and casts back is
    compared with fp8's tolerance against the bf16 one (it was compared bit-exactly)."""
    text = """
plan: wire
dims:
  num_tokens: 1..16
groups:
  tp: 1
inputs:
  x: bf16[num_tokens, 64]
outputs: [y, narrow, back]
ops:
  - narrow: copy(x, dtype=fp16)
  - back: copy(copy(x, dtype=fp8_e5m2), dtype=fp32)
  - region: r
    outputs: [y]
    variants:
      - name: fp8_wire
        when: num_tokens <= 8
        ops:
          - y: copy(all_gather(copy(x, dtype=fp8_e4m3), tp), dtype=bf16)
      - name: bf16_wire
        ops:
          - y: all_gather(x, tp)
"""
    p = computed_in(reference_compiled(load_text(text)))
    assert p["narrow"] == ["fp16"] and p["back"] == ["fp8_e5m2"] and "fp8_e4m3" in p["y"], p
    rep = run_check(lambda: load_text(text), num_tokens=12, seed=1)
    assert rep["ok"], [(o["name"], o.get("why")) for o in rep["outputs"]]
    assert len(rep["checked"]) >= 3 and all(c["ok"] for c in rep["checked"]), rep["checked"]
