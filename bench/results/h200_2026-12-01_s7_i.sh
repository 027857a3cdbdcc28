#!/bin/bash
# Device run I, seventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s7_i.sh
# The 4-layer model on the shipped table (run G's) with every row, 8 rounds, and the
# unlinked arm.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s7_i}
mkdir -p "$O"
timeout 400 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 8 --unlinked --table mlx_w8a8/tables/nvidia-h200.json --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -8 "$O/model.log"
