#!/usr/bin/env bash
# run28 (2026-11-30): ncu of the m_tile-16 fused kernel (tag handoff, +-ppf) against the m_tile-16
# stream kernel alone, and the m_tile-8 fused default against the t1/wn2 stream kernel: why is
# the fused kernel 2-3 us slower at m_tile 16 but only ~0.4 us at m_tile 8? Run after staging
# the wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu=$NCU" > $OUT/ncu.txt
P='16:{"kind":"stream","m_tile":16,"tiles":2,"warps_k":8,"unroll":4};16:{"kind":"fused","m_tile":16,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2,"ppf":1,"tag":1};16:{"kind":"fused","m_tile":16,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2,"tag":1};8:{"kind":"fused","m_tile":8,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2,"ppf":1,"tag":1};8:{"kind":"stream","m_tile":8,"tiles":1,"warps_n":2,"warps_k":8,"unroll":4}'
timeout 200 $NCU --kernel-name regex:cutlass --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__t_sector_hit_rate.pct,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__shared_mem_per_block_dynamic,launch__grid_size,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,lts__t_sector_hit_rate.pct,sm__cycles_active.avg,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum python3 scripts/bench_kda_kernels.py --profile-once "$P" >> $OUT/ncu.txt 2>&1
echo rc=$? >> $OUT/ncu.txt
