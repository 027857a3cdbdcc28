#!/bin/bash
# Device run E, ninth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s9_e.sh
# The full-depth model (32 Llama-3-8B layers) on the shipped table (run D's), every row.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s9_e}
mkdir -p "$O"
timeout 330 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --table mlx_w8a8/tables/nvidia-h200.json --json "$O/model32.jsonl" > "$O/model32.log" 2>&1
echo "32-layer model bench rc=$?"; tail -9 "$O/model32.log"
