#!/usr/bin/env bash
# run19 (2026-11-30): split-K F_A/beta prologue (sk) with shared-memory padding (spad) sweep
# (the sk / spad knobs exist at commits 82b64c2 (sk) and 7e46f25 (sk + spad) only)
# + ncu register/occupancy counts of the sk kernels.
export NCU_SPECS='8:{"kind":"fused","m_tile":8,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2,"sk":1};8:{"kind":"fused","m_tile":8,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2,"sk":1,"spad":64};16:{"kind":"fused","m_tile":16,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2,"sk":1}'
exec bash "$(dirname "$0")/run_gpu_variants.sh"
