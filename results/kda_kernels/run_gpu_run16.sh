#!/usr/bin/env bash
# run16 (2026-11-30): stream-kernel shapes with warps side by side along N (variant sweep)
# + ncu register/occupancy counts of the stream and fused kernels at m_tile 8 / 16.
export NCU_SPECS='8:{"kind":"stream","m_tile":8,"tiles":2,"warps_k":8,"unroll":4};8:{"kind":"stream","m_tile":8,"tiles":1,"warps_k":4,"unroll":4};8:{"kind":"stream","m_tile":8,"tiles":1,"warps_n":2,"warps_k":4,"unroll":4};8:{"kind":"fused","m_tile":8,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2,"ppf":1};16:{"kind":"stream","m_tile":16,"tiles":1,"warps_n":2,"warps_k":4,"unroll":4}'
exec bash "$(dirname "$0")/run_gpu_variants.sh"
