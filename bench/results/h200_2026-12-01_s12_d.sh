#!/bin/bash
# Device run D, twelfth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s12_d.sh
# The model on run C's table (now shipped): 4 and 32 Llama-3-8B layers against bf16 and
# mlx-lm 8-bit.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s12_d}
mkdir -p "$O"
timeout 170 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 6 --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -8 "$O/model.log"
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --json "$O/model32.jsonl" > "$O/model32.log" 2>&1
echo "32-layer model bench rc=$?"; tail -8 "$O/model32.log"
