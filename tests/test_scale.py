"""Compile time at scale: the 93-layer plan is fast; a generated 100,000-op plan stays under 30 s."""

import sys
import time

from tests.planutil import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from bench_compile_scale import measure  # noqa: E402


def test_100k_op_plan_compiles_under_30s(tmp_path):
    t0 = time.perf_counter()
    row = measure(100_000, tmp_path)
    dt = time.perf_counter() - t0
    assert row["ops"] >= 100_000
    assert row["collectives_after"] < 100  # ~1400 gathers packed into a few capped buckets
    assert dt < 30, f"{row['ops']} ops took {dt:.1f} s"


def test_growth_is_near_linear(tmp_path):
    small = measure(2000, tmp_path)
    big = measure(20000, tmp_path)
    ratio = big["total_s"] / max(small["total_s"], 1e-3)
    assert ratio < 10 * 2.0, f"10x more ops took {ratio:.1f}x longer"
