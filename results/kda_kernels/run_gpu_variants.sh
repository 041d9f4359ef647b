#!/usr/bin/env bash
# Variant sweep (L2 prefetch / tile shapes / launch attributes) + optional ncu metrics;
# run after staging the wheels (see run_gpu.sh), with PYTHONPATH and PLANNER_CACHE_DIR set.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
set -x
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/nvidia_smi.txt
timeout 280 python3 scripts/bench_kda_kernels.py --variant-sweep --out $OUT > $OUT/vsweep.log 2>&1; echo rc=$? >> $OUT/vsweep.log
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu=$NCU" > $OUT/ncu.txt
if [ -n "$NCU" ]; then
 P=${NCU_SPECS:-'1:{"kind":"fused","m_tile":8,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2};8:{"kind":"fused","m_tile":8,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2};16:{"kind":"fused","m_tile":16,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2};16:{"kind":"stream","m_tile":16,"tiles":2,"warps_k":8,"unroll":4};8:{"kind":"fused","m_tile":8,"tiles":2,"warps_k":8,"unroll":4,"fb_tiles":2,"pf":2}'}
 timeout 100 $NCU --kernel-name regex:cutlass --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__t_sector_hit_rate.pct,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__shared_mem_per_block_dynamic,launch__grid_size,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,lts__t_sector_hit_rate.pct python3 scripts/bench_kda_kernels.py --profile-once "$P" >> $OUT/ncu.txt 2>&1
 echo rc=$? >> $OUT/ncu.txt
fi
