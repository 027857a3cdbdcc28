#!/bin/bash
# Device run G, ninth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s9_g.sh
# The GEMV's digest now covers its sibling launch's code (left out of it by mistake in
# runs A-F): the shipped table's M = 1 / 8 entries re-measured, with the decode check.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s9_g}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 270 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A9 "check \(|interrupted|problem\(s\) in" "$O/tune.log" | cut -c1-200 | head -30
