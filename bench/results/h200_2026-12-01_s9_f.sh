#!/bin/bash
# Device run F, ninth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s9_f.sh
# The new prefill check (each layer group on its table choice against a challenger in
# the model's own prefill) on run D's table at T = 128, 512 and 2048 (entries fresh:
# nothing re-measured; the sibling check runs again first); the full-depth and the
# 4-layer model on the result.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s9_f}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 240 python3 -m mlx_w8a8.tune --model llama-3-8b --m 128,512,2048 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A12 "check \(|interrupted|skipped" "$O/tune.log" | cut -c1-220 | head -40
timeout 120 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --table "$T" --json "$O/model32.jsonl" > "$O/model32.log" 2>&1
echo "32-layer model bench rc=$?"; tail -8 "$O/model32.log"
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 6 --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -8 "$O/model.log"
