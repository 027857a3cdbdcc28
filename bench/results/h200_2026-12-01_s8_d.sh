#!/bin/bash
# Device run D, eighth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s8_d.sh
# GPU time (CUPTI) of every warp-specialized tile, the split-K cluster tiles included,
# against bf16 and mx.quantized_matmul, at small M; CUDA graphs off (run C).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s8_d}
mkdir -p "$O"
MLX_USE_CUDA_GRAPHS=0 timeout 400 python3 bench/tile_gpu_time.py --m 16,128,512 \
  --kn 4096x4096,4096x1024,4096x14336,14336x4096 --reps 5 > "$O/tile_gpu_time.log" 2>&1
echo "rc=$?"; grep -v Warning "$O/tile_gpu_time.log" | grep -v "_warn_once" | cut -c1-400
