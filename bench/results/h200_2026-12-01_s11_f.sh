#!/bin/bash
# Device run F, eleventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s11_f.sh
# Experiment (nothing shipped changes): launch shapes of the activation quantize, kernel
# time without graphs, each variant checked bit for bit against the shipped launch first.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s11_f}
mkdir -p "$O"
MLX_USE_CUDA_GRAPHS=0 timeout 200 python3 bench/quantize_variants.py --m 512,2048,8192 \
  --k 4096,14336 --chain 40 > "$O/quantize_variants.log" 2>&1
echo "variants rc=$?"; grep -E "^(M=|MLX)" "$O/quantize_variants.log"; grep -iE "error|Traceback" "$O/quantize_variants.log" | head -8
