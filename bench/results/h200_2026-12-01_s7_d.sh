#!/bin/bash
# Device run D, seventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s7_d.sh
# The 4-layer model on run C's table (include-line headers, sibling groups that stay on),
# 8 rounds per row, then the build / eval split of a prefill.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s7_d}
mkdir -p "$O"
timeout 280 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 8 --table mlx_w8a8/tables/nvidia-h200.json --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -8 "$O/model.log"
timeout 150 python3 bench/model_host_cost.py --model llama-3-8b --layers 4 --tokens 128,512 \
  --rounds 8 --table mlx_w8a8/tables/nvidia-h200.json --out "$O/host_cost.jsonl" \
  > "$O/host_cost.log" 2>&1
echo "host cost rc=$?"; cat "$O/host_cost.log"
