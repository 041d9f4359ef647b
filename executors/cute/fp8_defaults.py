"""Measured fp8 skinny-GEMM configs (pure Python): the fastest correct config per weight shape
and M bucket on an H200 (132 SMs), from `bench_fp8_gemm.py --sweep grid`.

Written by scripts/fp8_defaults_from_sweep.py from the record named in SOURCE (raw outputs under
results/data/fp8_gemm/); a row is kept only where the sweep's best beat the shape heuristic of
fp8_config.default_fp8_config by more than 2 %. Shapes not listed here, and other SM counts, use
the heuristic.
"""

from __future__ import annotations

SOURCE = 'results/data/fp8_gemm/2026-12-01T1416_h200-e96746ba_fp8_gemm.json'
SMS = 132
# (N, K, m_tile) -> Fp8Config fields
MEASURED: dict[tuple[int, int, int], dict] = {
    # kda_fa_beta: 2.29 us vs the heuristic fp8_m8_t1_wk28_u1_ki1_hw2_pdl1 2.75 us
    (144, 7168, 8): {"hw": 4, "ki": 1, "m_tile": 8, "minb": 0, "pdl": True, "tiles": 1, "unroll": 2, "warps_k": 28, "warps_n": 1},
    # kda_fa_beta: 2.87 us vs the heuristic fp8_m16_t1_wk28_u1_ki1_hw2_pdl1 3.44 us
    (144, 7168, 16): {"hw": 4, "ki": 1, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 1, "unroll": 2, "warps_k": 28, "warps_n": 1},
    # dsv3_shared_gate_up: 2.63 us vs the heuristic fp8_m8_t1_wk28_u1_ki1_hw2_pdl1 3.07 us
    (512, 7168, 8): {"hw": 4, "ki": 1, "m_tile": 8, "minb": 0, "pdl": True, "tiles": 1, "unroll": 2, "warps_k": 28, "warps_n": 1},
    # dsv3_shared_gate_up: 3.40 us vs the heuristic fp8_m16_t1_wk28_u1_ki1_hw2_pdl1 4.05 us
    (512, 7168, 16): {"hw": 4, "ki": 1, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 1, "unroll": 2, "warps_k": 28, "warps_n": 1},
    # dsv3_qkv_a: 5.61 us vs the heuristic fp8_m8_t2_wk14_u1_ki1_hw2_pdl1 7.59 us
    (2112, 7168, 8): {"hw": 4, "ki": 1, "m_tile": 8, "minb": 1, "pdl": True, "tiles": 2, "unroll": 2, "warps_k": 14, "warps_n": 1},
    # dsv3_qkv_a: 6.58 us vs the heuristic fp8_m16_t2_wk14_u1_ki1_hw2_pdl1 7.29 us
    (2112, 7168, 16): {"hw": 4, "ki": 1, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 2, "unroll": 1, "warps_k": 28, "warps_n": 1},
    # dsv3_q_b: 2.74 us vs the heuristic fp8_m8_t2_wk6_u1_ki1_hw2_pdl1 3.18 us
    (3072, 1536, 8): {"hw": 4, "ki": 1, "m_tile": 8, "minb": 2, "pdl": True, "tiles": 2, "unroll": 1, "warps_k": 6, "warps_n": 1},
    # dsv3_q_b: 2.85 us vs the heuristic fp8_m16_t2_wk6_u1_ki1_hw2_pdl1 3.55 us
    (3072, 1536, 16): {"hw": 4, "ki": 1, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 4, "unroll": 2, "warps_k": 6, "warps_n": 1},
    # dsv3_kv_b: 1.66 us vs the heuristic fp8_m8_t2_wk4_u1_ki1_hw2_pdl1 1.84 us
    (4096, 512, 8): {"hw": 4, "ki": 1, "m_tile": 8, "minb": 0, "pdl": True, "tiles": 2, "unroll": 1, "warps_k": 4, "warps_n": 1},
    # dsv3_kv_b: 2.05 us vs the heuristic fp8_m16_t2_wk4_u1_ki1_hw2_pdl1 2.23 us
    (4096, 512, 16): {"hw": 4, "ki": 1, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 1, "unroll": 1, "warps_k": 4, "warps_n": 1},
    # dsv3_mlp_gate_up: 10.98 us vs the heuristic fp8_m8_t2_wk7_u1_ki1_hw2_pdl1 14.26 us
    (4608, 7168, 8): {"hw": 2, "ki": 1, "m_tile": 8, "minb": 0, "pdl": True, "tiles": 1, "unroll": 1, "warps_k": 7, "warps_n": 1},
    # dsv3_mlp_gate_up: 11.92 us vs the heuristic fp8_m16_t2_wk7_u1_ki1_hw2_pdl1 19.69 us
    (4608, 7168, 16): {"hw": 4, "ki": 1, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 1, "unroll": 1, "warps_k": 7, "warps_n": 1},
    # kda_qkvg: 12.64 us vs the heuristic fp8_m8_t2_wk4_u1_ki1_hw2_pdl1 16.97 us
    (6144, 7168, 8): {"hw": 4, "ki": 1, "m_tile": 8, "minb": 3, "pdl": True, "tiles": 2, "unroll": 2, "warps_k": 4, "warps_n": 1},
    # kda_qkvg: 14.40 us vs the heuristic fp8_m16_t2_wk4_u1_ki1_hw2_pdl1 20.53 us
    (6144, 7168, 16): {"hw": 4, "ki": 1, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 2, "unroll": 1, "warps_k": 8, "warps_n": 1},
    # dsv3_shared_down: 1.68 us vs the heuristic fp8_m8_t2_wk2_u1_ki1_hw2_pdl1 1.90 us
    (7168, 256, 8): {"hw": 4, "ki": 1, "m_tile": 8, "minb": 2, "pdl": True, "tiles": 4, "unroll": 1, "warps_k": 2, "warps_n": 1},
    # dsv3_shared_down: 1.84 us vs the heuristic fp8_m16_t2_wk2_u1_ki1_hw2_pdl1 2.06 us
    (7168, 256, 16): {"hw": 4, "ki": 1, "m_tile": 16, "minb": 4, "pdl": True, "tiles": 2, "unroll": 1, "warps_k": 2, "warps_n": 1},
    # dsv3_o_proj: 4.89 us vs the heuristic fp8_m8_t2_wk4_u1_ki1_hw2_pdl1 6.79 us
    (7168, 2048, 8): {"hw": 4, "ki": 1, "m_tile": 8, "minb": 2, "pdl": True, "tiles": 4, "unroll": 1, "warps_k": 8, "warps_n": 1},
    # dsv3_o_proj: 5.69 us vs the heuristic fp8_m16_t2_wk4_u1_ki1_hw2_pdl1 7.33 us
    (7168, 2048, 16): {"hw": 2, "ki": 1, "m_tile": 16, "minb": 2, "pdl": True, "tiles": 4, "unroll": 1, "warps_k": 8, "warps_n": 1},
    # dsv3_mlp_down: 5.77 us vs the heuristic fp8_m8_t2_wk3_u1_ki1_hw2_pdl1 7.89 us
    (7168, 2304, 8): {"hw": 4, "ki": 1, "m_tile": 8, "minb": 2, "pdl": True, "tiles": 4, "unroll": 1, "warps_k": 6, "warps_n": 1},
    # dsv3_mlp_down: 6.44 us vs the heuristic fp8_m16_t2_wk3_u1_ki1_hw2_pdl1 9.60 us
    (7168, 2304, 16): {"hw": 2, "ki": 1, "m_tile": 16, "minb": 2, "pdl": True, "tiles": 4, "unroll": 1, "warps_k": 6, "warps_n": 1},
}
