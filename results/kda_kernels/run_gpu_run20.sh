#!/usr/bin/env bash
# run20 (2026-11-30): blocks per SM pinned to 3 with spad + carveout (stream t2/wk8 m8 at 62
# (needs commit 7e46f25: the sk / spad knobs were removed again after this run)
# registers and sk at 56 would allow 4) - variant sweep + ncu occupancy limits.
export NCU_SPECS='8:{"kind":"stream","m_tile":8,"tiles":2,"warps_k":8,"unroll":4,"spad":14,"carve":28};8:{"kind":"fused","m_tile":8,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2,"sk":1,"spad":14,"carve":28}'
exec bash "$(dirname "$0")/run_gpu_variants.sh"
