#!/bin/bash
# Device run I, sixth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s6_i.sh
# The model benchmark on the shipped table (run F's) with 8 rounds per row: runs F and G
# used 4, and their T = 512 and 2048 rows straddled the targets.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s6_i}
mkdir -p "$O"
timeout 200 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 8 --table mlx_w8a8/tables/nvidia-h200.json --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -8 "$O/model.log"
