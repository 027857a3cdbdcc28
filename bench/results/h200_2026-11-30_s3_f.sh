#!/bin/bash
# Device run F, third set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s3_f.sh
# Why the 4-layer Llama-3-8B prefills slower than bf16 at T <= 512 (run D: 0.77x / 0.78x)
# while each W8A8 projection is 1.01-1.29x bf16 at M = 512 (run E): graph build (host
# only) vs evaluation, per variant, with the shipped table.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s3_f}
mkdir -p "$O"
timeout 170 python3 bench/model_host_cost.py --model llama-3-8b --layers 4 --tokens 128,512,2048 \
  --rounds 8 --out "$O/host_cost.jsonl" > "$O/host_cost.log" 2>&1
echo "host cost rc=$?"; cat "$O/host_cost.log"
