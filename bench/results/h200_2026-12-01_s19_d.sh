#!/bin/bash
# Device run D, nineteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s19_d.sh
# Ran main at commit 0812c80 plus bench/tile_gpu_time.py --coop (committed after this run).
# Where the TMA GEMM's 128 x 128 tile gives a block one tile (M = 512 on N = 4096 and
# N = 3584: 128 and 112 tiles for 132 SMs), its ping-pong consumers leave the second
# warpgroup without a tile. Kernel time (CUPTI, graphs off) of the per-channel GEMM on the
# ping-pong tile against the same tile with cooperative consumers (both warpgroups on
# every tile, 64 rows each), beside bf16, qmm and the quantize, at M = 128, 512, 1024.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s19_d}
mkdir -p "$O"
MLX_USE_CUDA_GRAPHS=0 timeout 400 python3 bench/tile_gpu_time.py --m 128,512,1024 \
  --kn 4096x4096,14336x4096,4096x14336,18944x3584 --tiles tma128pp --coop --reps 7 \
  > "$O/tiles.log" 2>&1
echo "tiles rc=$?"; grep -v Warning "$O/tiles.log" | grep -v warn_once
