#!/bin/bash
# Device run A2, sixth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> QB=<folder> bash bench/results/h200_2026-11-30_s6_a2.sh
# ncu of the rowsum quantize at M = 8192, K = 4096 bf16: run A's kernel (division-free
# rounding, loads still consumed one by one), the parent commit's (QB) and rowsum_warp.
# Launch order in --once: the bench's own 2 quantizes (new), quant_base x2, quant_warp x2.
set -u
O=${OUT:-/tmp/s6_a2}
QB=${QB:-.device-mlx/quant_base}
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats"
A="python3 bench/cuda_bench.py --once quant_base,quant_warp --m 8192 --kn 4096x4096 --quant-base $QB"
timeout 100 ncu --clock-control none $S -k regex:w8a8_quantize_rowsum --launch-count 1 $A > "$O/ncu_new.txt" 2>&1; echo "new rc=$?"
timeout 100 ncu --clock-control none $S -k regex:w8a8_quantize_rowsum --launch-skip 2 --launch-count 1 $A > "$O/ncu_base.txt" 2>&1; echo "base rc=$?"
timeout 100 ncu --clock-control none $S -k regex:rowsum_warp --launch-count 1 $A > "$O/ncu_warp.txt" 2>&1; echo "warp rc=$?"
for f in new base warp; do echo "== $f"; grep -E "w8a8_quantize|Duration|Throughput|Registers|Achieved Occ|Theoretical Occ|Issue Slots Busy|Eligible Warps|Active Warps Per|Stall|No Eligible|Warp Cycles Per Issued" "$O/ncu_$f.txt" | head -30; done
