#!/bin/bash
# Device run H, sixth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s6_h.sh
# Runs F and G measured T = 2048 at 1.19x / 1.21x bf16 with a wide spread (p25 0.82x,
# 0.87x) on run F's table, whose sibling check kept the group launches at T = 2048
# (1.03x, p25 1.00x); run D (groups off there) measured 1.35x. Here the same table with
# the siblings linked and unlinked, paired, 8 rounds, prefill T = 2048 only.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s6_h}
mkdir -p "$O"
timeout 200 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 2048 --decode 0 \
  --rounds 8 --unlinked --table mlx_w8a8/tables/nvidia-h200.json --json "$O/model.jsonl" \
  > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -7 "$O/model.log"
