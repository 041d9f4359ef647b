"""Measured fp8 skinny-GEMM configs (pure Python): the fastest correct config per weight shape
and M bucket on an H200 (132 SMs), from `bench_fp8_gemm.py --sweep grid`.

Written by scripts/fp8_defaults_from_sweep.py from the record named in SOURCE (raw outputs under
results/data/fp8_gemm/); a row is kept only where the sweep's best beat the shape heuristic of
fp8_config.default_fp8_config by more than 2 %. Shapes not listed here, and other SM counts, use
the heuristic.
"""

from __future__ import annotations

SOURCE = 'results/data/fp8_gemm/2026-12-02T0332_h200-0ea4ecdd_fp8_gemm.json (rows it did not improve: results/data/fp8_gemm/2026-12-01T2315_h200-9cae9ccd_fp8_gemm.json, results/data/fp8_gemm/2026-12-01T2118_h200-7c5fb5dc_fp8_gemm.json, results/data/fp8_gemm/2026-12-01T2047_h200-27c05724_fp8_gemm.json, results/data/fp8_gemm/2026-12-01T1444_h200-aac1a792_fp8_gemm.json, results/data/fp8_gemm/2026-12-01T1416_h200-e96746ba_fp8_gemm.json)'
SMS = 132
# (N, K, m_tile) -> Fp8Config fields
MEASURED: dict[tuple[int, int, int], dict] = {
    # kda_fa_beta (replaces fp8_m8_t1_wk28_u2_ki1_hw4_pdl1, 2.54 us in results/data/fp8_gemm/2026-12-01T2315_h200-9cae9ccd_fp8_gemm.json): 2.42 us vs the heuristic fp8_m8_t1_wk28_u1_ki1_hw4_pdl1 not timed
    (144, 7168, 8): {"bulk": 0, "depth": 1, "early": True, "hw": 4, "ki": 0, "l2pre": 0, "m_tile": 8, "minb": 0, "pdl": True, "tiles": 1, "unroll": 2, "warps_k": 28, "warps_n": 1, "xahead": 1},
    # kda_fa_beta (replaces fp8_m16_t1_wk28_u2_ki1_hw4_pdl1, 3.33 us in results/data/fp8_gemm/2026-12-01T2315_h200-9cae9ccd_fp8_gemm.json): 2.93 us vs the heuristic fp8_m16_t1_wk28_u1_ki1_hw4_pdl1 not timed
    (144, 7168, 16): {"bulk": 0, "depth": 1, "early": True, "hw": 4, "ki": 0, "l2pre": 0, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 1, "unroll": 2, "warps_k": 28, "warps_n": 1, "xahead": 1},
    # dsv3_shared_gate_up: 2.52 us vs the heuristic fp8_m8_t1_wk28_u1_ki1_hw4_pdl1 not timed
    (512, 7168, 8): {"bulk": 0, "depth": 1, "early": False, "hw": 4, "ki": 1, "l2pre": 0, "m_tile": 8, "minb": 0, "pdl": True, "tiles": 1, "unroll": 2, "warps_k": 28, "warps_n": 1, "xahead": 1},
    # dsv3_shared_gate_up (replaces fp8_m16_t1_wk28_u2_ki1_hw4_pdl1, 3.28 us in results/data/fp8_gemm/2026-12-01T2315_h200-9cae9ccd_fp8_gemm.json): 3.10 us vs the heuristic fp8_m16_t1_wk28_u1_ki1_hw4_pdl1 not timed
    (512, 7168, 16): {"bulk": 0, "depth": 1, "early": True, "hw": 4, "ki": 0, "l2pre": 0, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 1, "unroll": 2, "warps_k": 28, "warps_n": 1, "xahead": 1},
    # kda_fb (replaces fp8_m8_t1_wk1_u1_ki1_hw2_pdl1, 1.44 us in results/data/fp8_gemm/2026-12-01T2315_h200-9cae9ccd_fp8_gemm.json): 1.40 us vs the heuristic fp8_m8_t1_wk1_u1_ki1_hw4_pdl1 1.51 us
    (1536, 128, 8): {"bulk": 0, "depth": 1, "early": False, "hw": 2, "ki": 1, "l2pre": 0, "m_tile": 8, "minb": 2, "pdl": True, "tiles": 1, "unroll": 1, "warps_k": 1, "warps_n": 1, "xahead": 1},
    # kda_fb: 1.71 us vs the heuristic fp8_m16_t1_wk1_u1_ki1_hw4_pdl1 1.80 us
    (1536, 128, 16): {"bulk": 0, "depth": 1, "early": False, "hw": 2, "ki": 1, "l2pre": 0, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 1, "unroll": 1, "warps_k": 1, "warps_n": 1, "xahead": 1},
    # dsv3_qkv_a: 5.61 us vs the heuristic fp8_m8_t2_wk14_u1_ki1_hw4_pdl1 not timed
    (2112, 7168, 8): {"bulk": 0, "depth": 1, "early": False, "hw": 4, "ki": 1, "ks": 1, "l2pre": 0, "m_tile": 8, "minb": 1, "pdl": True, "tiles": 2, "timeline": False, "unroll": 2, "warps_k": 14, "warps_n": 1, "wg": False, "wgr": False, "xahead": 1},
    # dsv3_qkv_a: 6.62 us vs the heuristic fp8_m16_t2_wk14_u1_ki1_hw4_pdl1 7.10 us
    (2112, 7168, 16): {"bulk": 0, "depth": 1, "early": False, "hw": 4, "ki": 1, "ks": 1, "l2pre": 0, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 2, "timeline": False, "unroll": 1, "warps_k": 28, "warps_n": 1, "wg": False, "wgr": False, "xahead": 1},
    # dsv3_q_b (replaces fp8_m8_t4_wk6_u1_ki0_hw4_mb2_p2_pdl1, 2.69 us in results/data/fp8_gemm/2026-12-02T0332_h200-0ea4ecdd_fp8_gemm.json): 2.40 us vs the heuristic fp8_m8_t2_wk6_u1_ki1_hw4_pdl1 not timed
    (3072, 1536, 8): {"bulk": 0, "depth": 3, "early": True, "hw": 2, "ki": 1, "ks": 1, "l2pre": 0, "m_tile": 8, "minb": 0, "pdl": True, "tiles": 1, "timeline": False, "unroll": 3, "warps_k": 4, "warps_n": 1, "wg": False, "wgr": True, "xahead": 1},
    # dsv3_q_b: 2.94 us vs the heuristic fp8_m16_t2_wk6_u1_ki1_hw4_pdl1 not timed
    (3072, 1536, 16): {"bulk": 0, "depth": 1, "early": False, "hw": 4, "ki": 1, "ks": 1, "l2pre": 0, "m_tile": 16, "minb": 1, "pdl": True, "tiles": 4, "timeline": False, "unroll": 2, "warps_k": 6, "warps_n": 1, "wg": False, "wgr": False, "xahead": 1},
    # dsv3_kv_b: 1.71 us vs the heuristic fp8_m8_t2_wk4_u1_ki1_hw4_pdl1 1.71 us
    (4096, 512, 8): {"bulk": 0, "depth": 1, "early": False, "hw": 4, "ki": 1, "l2pre": 0, "m_tile": 8, "minb": 0, "pdl": True, "tiles": 2, "unroll": 1, "warps_k": 4, "warps_n": 1, "xahead": 1},
    # dsv3_mlp_gate_up (replaces fp8_m8_t1_wk7_u1_ki1_hw2_pdl1, 11.57 us in results/data/fp8_gemm/2026-12-01T2315_h200-9cae9ccd_fp8_gemm.json): 11.29 us vs the heuristic fp8_m8_t2_wk7_u1_ki1_hw4_pdl1 not timed
    (4608, 7168, 8): {"bulk": 0, "depth": 1, "early": True, "hw": 4, "ki": 1, "ks": 1, "l2pre": 0, "m_tile": 8, "minb": 0, "pdl": True, "tiles": 1, "timeline": False, "unroll": 1, "warps_k": 7, "warps_n": 1, "wg": False, "wgr": False, "xahead": 1},
    # dsv3_mlp_gate_up: 12.08 us vs the heuristic fp8_m16_t2_wk7_u1_ki1_hw4_pdl1 12.73 us
    (4608, 7168, 16): {"bulk": 0, "depth": 1, "early": False, "hw": 4, "ki": 1, "ks": 1, "l2pre": 0, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 1, "timeline": False, "unroll": 1, "warps_k": 7, "warps_n": 1, "wg": False, "wgr": False, "xahead": 1},
    # kda_qkvg (replaces fp8_m8_t2_wk4_u2_ki1_hw4_b3_pdl1, 12.13 us in this record): 11.50 us vs the heuristic fp8_m8_t2_wk4_u1_ki1_hw4_pdl1 not timed
    (6144, 7168, 8): {"bulk": 3, "depth": 1, "early": False, "hw": 4, "ki": 0, "ks": 1, "l2pre": 0, "m_tile": 8, "minb": 0, "pdl": True, "tiles": 2, "timeline": False, "unroll": 2, "warps_k": 4, "warps_n": 1, "wg": False, "wgr": False, "xahead": 3},
    # kda_qkvg (replaces fp8_m16_t2_wk8_u1_ki0_hw4_pdl1, 13.79 us in this record): 12.99 us vs the heuristic fp8_m16_t2_wk4_u1_ki1_hw4_pdl1 not timed
    (6144, 7168, 16): {"bulk": 2, "depth": 1, "early": False, "hw": 4, "ki": 0, "ks": 1, "l2pre": 0, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 2, "timeline": False, "unroll": 2, "warps_k": 4, "warps_n": 1, "wg": False, "wgr": False, "xahead": 1},
    # dsv3_shared_down: 1.73 us vs the heuristic fp8_m8_t2_wk2_u1_ki1_hw4_pdl1 not timed
    (7168, 256, 8): {"bulk": 0, "depth": 1, "early": False, "hw": 4, "ki": 1, "l2pre": 0, "m_tile": 8, "minb": 2, "pdl": True, "tiles": 4, "unroll": 1, "warps_k": 2, "warps_n": 1, "xahead": 1},
    # dsv3_shared_down: 1.90 us vs the heuristic fp8_m16_t2_wk2_u1_ki1_hw4_pdl1 not timed
    (7168, 256, 16): {"bulk": 0, "depth": 1, "early": False, "hw": 4, "ki": 1, "l2pre": 0, "m_tile": 16, "minb": 4, "pdl": True, "tiles": 2, "unroll": 1, "warps_k": 2, "warps_n": 1, "xahead": 1},
    # dsv3_o_proj (replaces fp8_m8_t4_wk8_u1_ki1_hw4_mb2_pdl1, 5.02 us in results/data/fp8_gemm/2026-12-01T2315_h200-9cae9ccd_fp8_gemm.json): 4.75 us vs the heuristic fp8_m8_t2_wk4_u1_ki1_hw4_pdl1 not timed
    (7168, 2048, 8): {"bulk": 0, "depth": 1, "early": False, "hw": 4, "ki": 1, "ks": 1, "l2pre": 2, "m_tile": 8, "minb": 2, "pdl": True, "tiles": 4, "timeline": False, "unroll": 1, "warps_k": 8, "warps_n": 1, "wg": False, "wgr": False, "xahead": 1},
    # dsv3_o_proj (replaces fp8_m16_t4_wk8_u1_ki1_hw2_mb2_pdl1, 5.71 us in results/data/fp8_gemm/2026-12-01T2315_h200-9cae9ccd_fp8_gemm.json): 5.52 us vs the heuristic fp8_m16_t2_wk4_u1_ki1_hw4_pdl1 not timed
    (7168, 2048, 16): {"bulk": 0, "depth": 1, "early": False, "hw": 2, "ki": 1, "ks": 1, "l2pre": 4, "m_tile": 16, "minb": 2, "pdl": True, "tiles": 4, "timeline": False, "unroll": 1, "warps_k": 4, "warps_n": 1, "wg": False, "wgr": False, "xahead": 1},
    # dsv3_mlp_down (replaces fp8_m8_t4_wk6_u1_ki1_hw4_mb2_d2_pdl1, 5.51 us in results/data/fp8_gemm/2026-12-01T2315_h200-9cae9ccd_fp8_gemm.json): 5.20 us vs the heuristic fp8_m8_t2_wk3_u1_ki1_hw4_pdl1 not timed
    (7168, 2304, 8): {"bulk": 0, "depth": 2, "early": False, "hw": 4, "ki": 0, "ks": 1, "l2pre": 3, "m_tile": 8, "minb": 2, "pdl": True, "tiles": 4, "timeline": False, "unroll": 1, "warps_k": 6, "warps_n": 1, "wg": False, "wgr": False, "xahead": 1},
    # dsv3_mlp_down: 6.22 us vs the heuristic fp8_m16_t2_wk3_u1_ki1_hw4_pdl1 not timed
    (7168, 2304, 16): {"bulk": 0, "depth": 1, "early": False, "hw": 2, "ki": 0, "ks": 1, "l2pre": 0, "m_tile": 16, "minb": 2, "pdl": True, "tiles": 4, "timeline": False, "unroll": 1, "warps_k": 6, "warps_n": 1, "wg": False, "wgr": False, "xahead": 1},
}

# per-tensor scales on both operands: (N, K, m_tile) -> Fp8Config fields, where a sweep with them beat
# the row above (MEASURED) by more than 2 %
SOURCE_TENSOR = 'results/data/fp8_gemm/2026-12-01T1630_h200-156048c6_fp8_gemm.json'
MEASURED_TENSOR: dict[tuple[int, int, int], dict] = {
    # kda_fa_beta: 3.09 us vs the block-scale default fp8_m16_t1_wk28_u2_ki1_hw4_pdl1 3.16 us
    (144, 7168, 16): {"depth": 1, "hw": 4, "ki": 0, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 1, "unroll": 2, "warps_k": 28, "warps_n": 1},
    # kda_fb: 1.57 us vs the block-scale default fp8_m16_t1_wk1_u1_ki1_hw2_pdl1 1.65 us
    (1536, 128, 16): {"depth": 1, "hw": 2, "ki": 1, "m_tile": 16, "minb": 2, "pdl": True, "tiles": 1, "unroll": 1, "warps_k": 1, "warps_n": 1},
    # dsv3_q_b: 2.54 us vs the block-scale default fp8_m8_t2_wk6_u1_ki0_hw4_mb2_pdl1 2.68 us
    (3072, 1536, 8): {"depth": 1, "hw": 4, "ki": 0, "m_tile": 8, "minb": 2, "pdl": True, "tiles": 2, "unroll": 1, "warps_k": 6, "warps_n": 2},
    # dsv3_kv_b: 2.09 us vs the block-scale default fp8_m16_t1_wk4_u1_ki1_hw4_pdl1 2.16 us
    (4096, 512, 16): {"depth": 1, "hw": 4, "ki": 1, "m_tile": 16, "minb": 4, "pdl": True, "tiles": 1, "unroll": 1, "warps_k": 4, "warps_n": 1},
    # dsv3_mlp_gate_up: 11.99 us vs the block-scale default fp8_m16_t1_wk7_u1_ki1_hw4_pdl1 17.26 us
    (4608, 7168, 16): {"depth": 2, "hw": 4, "ki": 1, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 1, "unroll": 1, "warps_k": 7, "warps_n": 1},
    # kda_qkvg: 12.50 us vs the block-scale default fp8_m8_t2_wk4_u2_ki1_hw4_mb3_pdl1 12.98 us
    (6144, 7168, 8): {"depth": 2, "hw": 4, "ki": 1, "m_tile": 8, "minb": 3, "pdl": True, "tiles": 2, "unroll": 2, "warps_k": 4, "warps_n": 1},
    # kda_qkvg: 13.51 us vs the block-scale default fp8_m16_t2_wk8_u1_ki0_hw4_pdl1 16.32 us
    (6144, 7168, 16): {"depth": 1, "hw": 2, "ki": 0, "m_tile": 16, "minb": 0, "pdl": True, "tiles": 2, "unroll": 1, "warps_k": 8, "warps_n": 1},
    # dsv3_mlp_down: 5.32 us vs the block-scale default fp8_m8_t4_wk6_u1_ki1_hw4_mb2_d2_pdl1 5.46 us
    (7168, 2304, 8): {"depth": 2, "hw": 4, "ki": 0, "m_tile": 8, "minb": 2, "pdl": True, "tiles": 4, "unroll": 1, "warps_k": 6, "warps_n": 1},
    # dsv3_mlp_down: 5.92 us vs the block-scale default fp8_m16_t4_wk6_u1_ki0_hw2_mb2_pdl1 6.04 us
    (7168, 2304, 16): {"depth": 1, "hw": 4, "ki": 0, "m_tile": 16, "minb": 2, "pdl": True, "tiles": 4, "unroll": 1, "warps_k": 6, "warps_n": 1},
}
