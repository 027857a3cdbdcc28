#!/bin/bash
# Device run F, fifteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s15_f.sh
# The final tree (the division-free quantize, blocks capped at 512 threads, the table of
# run C) at full depth: all 32 Llama-3-8B layers against bf16 and mlx-lm 8-bit, as the
# thirteenth set's run C (4 rounds).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s15_f}
mkdir -p "$O"
timeout 250 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 16,128,512,2048 --decode 32 \
  --rounds 4 --json "$O/model32.jsonl" > "$O/model32.log" 2>&1
echo "32-layer model rc=$?"; tail -8 "$O/model32.log"
