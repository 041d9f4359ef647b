"""Compile cost at scale: a generated 100,000-op plan compiles, and its cost grows near linearly.

Growth is a ratio of two sizes measured in the same run, so a slow or busy machine does not fail
it; the absolute seconds are scripts/bench_compile_scale.py's to print.
"""

import importlib.util

from tests.planutil import ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("bench_compile_scale", ROOT / "scripts" / "bench_compile_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_100k_op_plan_compile_grows_near_linearly(tmp_path):
    bench = _bench()
    small = bench.measure(10_000, tmp_path)
    big = bench.measure(100_000, tmp_path)
    assert big["ops"] >= 100_000 and small["ops"] >= 10_000
    assert big["collectives_after"] < 100  # ~1400 gathers packed into a few capped buckets
    ops = big["ops"] / small["ops"]
    ratio = big["total_s"] / max(small["total_s"], 1e-3)
    # per-op cost at 100k at most twice that at 10k (quadratic growth would be ~10x)
    assert ratio < 2.0 * ops, f"{ops:.1f}x more ops took {ratio:.1f}x longer"
