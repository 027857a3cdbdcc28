#!/bin/bash
# Device run C, sixth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s6_c.sh
# The quantize kernel changed (runs A, B), so every entry of the shipped table that
# measured a CUDA linear is stale: re-tune the prefill sizes (checks in run D).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s6_c}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 540 python3 -m mlx_w8a8.tune --model llama-3-8b --m 128,512,2048 --pairs 8 \
  --decode-check off --sibling-check off --table "$T" --no-progress > "$O/tune_prefill.log" 2>&1
echo "tune prefill rc=$?"; tail -5 "$O/tune_prefill.log" | cut -c1-200
