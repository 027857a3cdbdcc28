#!/bin/bash
# Device run B, seventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s7_b.sh
# Run I's decisions record showed q/k/v and gate/up running alone at T = 512 and 2048
# (no "+siblings"): trace where the sibling groups count unused launches and switch off.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s7_b}
mkdir -p "$O"
timeout 300 python3 bench/sibling_trace.py --model llama-3-8b --layers 4 --tokens 128,512,2048 \
  --decode 8 --table mlx_w8a8/tables/nvidia-h200.json > "$O/sibling_trace.log" 2>&1
echo "trace rc=$?"; cat "$O/sibling_trace.log" | cut -c1-300 | head -80
