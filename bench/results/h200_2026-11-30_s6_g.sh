#!/bin/bash
# Device run G, sixth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s6_g.sh
# The model benchmark again on run F's table (now shipped): run F's T = 2048 row spread
# widely (p25 0.82x).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s6_g}
mkdir -p "$O"
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --table mlx_w8a8/tables/nvidia-h200.json --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -8 "$O/model.log"
