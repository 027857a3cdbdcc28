#!/bin/bash
# Device run D, seventeenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s17_d.sh
# Ran main at commit e55a26f (the model checks' second look at unsettled verdicts,
# --extra-rounds, default: as many rounds again). A fresh table for Llama-3-8B at
# M = 16 and 512 with the sibling and prefill checks at the default depth (auto: all 32
# blocks on the H200), progress shown, so the log says where a verdict was extended.
# Not shipped: a demonstration of the checks on the GPU.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s17_d}
mkdir -p "$O"
timeout 570 python3 -m mlx_w8a8.tune --model llama-3-8b --m 16,512 --table "$O/tune.json" \
  > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -vE "^(16|512) |^--|^M |round [0-9]+/" "$O/tune.log" | tail -40
