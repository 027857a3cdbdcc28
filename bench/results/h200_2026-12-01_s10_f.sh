#!/bin/bash
# Device run F, tenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s10_f.sh
# ncu of the TMA int32 GEMM on its own tile choice, the fifth set's run F sections: gate/up
# at M = 2048 (K = 4096: the ping-pong 128 x 128 tile) and 4096 x 4096 at M = 2048.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s10_f}
mkdir -p "$O"
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats"
for kn in 4096x14336 4096x4096; do
  timeout 70 ncu --clock-control none $S -k regex:gemm_ws_tma --launch-count 1 \
    python3 bench/cuda_bench.py --once i8gemm_tma --m 2048 --kn $kn > "$O/ncu_$kn.txt" 2>&1
  echo "ncu $kn rc=$?"; grep -E "gemm_ws|Duration|SM Frequency|Throughput|Busy|Issue Slots|Hit Rate|Eligible|Stall" "$O/ncu_$kn.txt" | head -24
done
