#!/bin/bash
# Device run G, eighth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s8_g.sh
# The 4-layer model on the shipped table (run F's) with every row, 8 rounds, and the
# unlinked arm; the GPU timeline of its prefill at T = 128 and 512 against bf16's.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s8_g}
mkdir -p "$O"
timeout 300 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 8 --unlinked --table mlx_w8a8/tables/nvidia-h200.json --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -9 "$O/model.log"
timeout 120 python3 bench/gpu_timeline.py --model llama-3-8b --layers 4 --tokens 128,512 --decode 0 \
  --rounds 4 --variants bf16,mlx_w8a8 --table mlx_w8a8/tables/nvidia-h200.json \
  --out "$O/timeline.jsonl" > "$O/timeline.log" 2>&1
echo "timeline rc=$?"; grep -v "^    " "$O/timeline.log" | grep -v -i warn | tail -40
