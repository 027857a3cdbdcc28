#!/bin/bash
# Device run B, ninth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s9_b.sh
# Run A's table (M = 1 / 8 entries fresh) through the decode check again, now with its
# second pass (members of a replaced sibling launch judged on their own kernels); the
# 4-layer model on the result; then the full-depth model: 32 Llama-3-8B layers.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s9_b}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp bench/results/h200_2026-12-01_s9_a_nvidia-h200.json "$T"
timeout -s INT 150 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A9 "check \(|interrupted" "$O/tune.log" | cut -c1-200 | head -30
timeout 170 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 6 --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -9 "$O/model.log"
timeout 230 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 512,2048 --decode 32 \
  --rounds 3 --table "$T" --json "$O/model32.jsonl" > "$O/model32.log" 2>&1
echo "32-layer model bench rc=$?"; tail -9 "$O/model32.log"
