#!/bin/bash
# Device run D, sixth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s6_d.sh
# Starts from run C's table (copied into mlx_w8a8/tables/ first): the decode sizes and
# whatever run C left, the decode and sibling checks (T = 128, 512, 2048), then the
# 4-layer Llama-3-8B model benchmark on the result.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s6_d}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 330 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8,128,512,2048 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A9 "check|interrupted" "$O/tune.log" | cut -c1-200 | head -40
timeout 200 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -9 "$O/model.log"
