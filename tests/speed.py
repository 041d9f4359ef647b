"""This machine's speed, measured in the same test run, so that a cost bound is a ratio and not
seconds: CI machines run two to three times slower than a dev machine, and a bound in seconds that
fits one fails on the other. A bound here says "at most R reference workloads", which holds on any
machine and still catches a walk that grew worse than linear (that costs 10-100x, not 2x).
"""

from __future__ import annotations

import functools
import time

__all__ = ["unit_s", "in_units", "best_of"]


def _reference_work() -> int:
    # what the planner spends its time on: small dicts keyed by strings, calls, tuples, formatting
    d: dict[str, int] = {}
    total = 0
    for i in range(20_000):
        k = f"op{i % 701}"
        d[k] = d.get(k, 0) + (i & 7)
        total += len((k, i, d[k]))
    return total


def best_of(fn, repeat: int = 5, number: int = 1) -> float:
    """The best mean time of `number` calls of fn over `repeat` batches (noise only adds time)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


@functools.cache
def unit_s() -> float:
    """Seconds one reference workload takes here (5-6 ms on an idle 2-core dev machine, up to twice
    that beside another test run)."""
    return best_of(_reference_work, repeat=7)


def in_units(seconds: float) -> float:
    """A time expressed in reference workloads of this machine."""
    return seconds / unit_s()
