"""Measured fp8 skinny-GEMM configs (pure Python): the fastest correct config per weight shape
and M bucket on an H200 (132 SMs), from `bench_fp8_gemm.py --sweep grid`.

Written by scripts/fp8_defaults_from_sweep.py from the record named in SOURCE (raw outputs under
results/data/fp8_gemm/); a row is kept only where the sweep's best beat the shape heuristic of
fp8_config.default_fp8_config by more than 2 %. Shapes not listed here, and other SM counts, use
the heuristic.
"""

from __future__ import annotations

SOURCE = ""
SMS = 132
# (N, K, m_tile) -> Fp8Config fields
MEASURED: dict[tuple[int, int, int], dict] = {}
