#!/bin/bash
# Device run E, second set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s2_e.sh
# The whole 32-layer Llama-3-8B shape (random weights), shipped table as in this tree.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s2_e}
timeout 400 python3 -m mlx_w8a8.bench --model llama-3-8b --tokens 128,2048 --decode 32 \
  --rounds 4 --json "$O/model32.jsonl" > "$O/model32.log" 2>&1
echo "model bench rc=$?"; tail -7 "$O/model32.log"
