#!/usr/bin/env bash
# run12 (2026-11-30): fused-kernel producer L2 prefetch (ppf) / consumers-first order (cf)
# variant sweep + ncu on the fused kernels; run after staging the wheels (run_gpu.sh).
export NCU_SPECS='8:{"kind":"fused","m_tile":8,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2};8:{"kind":"fused","m_tile":8,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2,"ppf":1};16:{"kind":"fused","m_tile":16,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2};16:{"kind":"fused","m_tile":16,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2,"fb_passes":4,"ppf":1,"cf":1};16:{"kind":"stream","m_tile":16,"tiles":2,"warps_k":8,"unroll":4}'
exec bash "$(dirname "$0")/run_gpu_variants.sh"
