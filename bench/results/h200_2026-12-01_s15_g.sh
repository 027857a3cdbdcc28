#!/bin/bash
# Device run G, fifteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s15_g.sh
# Run F: at full depth (32 layers) the model decoded at 0.90x (0.89..0.92) mlx-lm 8-bit,
# where run C's decode check on 4 layers had kept the W8A8 GEMV for gate/up (14336 x
# 4096, 1.12x). The decode check again on the shipped table (M = 1 entries not
# re-measured), on all 32 layers: it judges only the groups still on a W8A8 kernel.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s15_g}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 170 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1 --table "$T" --check-layers 32 \
  --no-progress > "$O/tune1.log" 2>&1
echo "tune 1 rc=$?"; grep -iE -A6 "decode check|interrupted|problem\(s\) in" "$O/tune1.log" | cut -c1-200 | head -20
