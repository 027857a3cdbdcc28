#!/bin/bash
# Device run G, fourteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s14_g.sh
# Ran branch fused-norm, commit 829fbb6 (a first call stopped in the script's own bit
# comparison: numpy has no bfloat16; fixed in that commit). Run F: the fused norm saved no measurable model time (fused /
# unfused 0.95-1.02x). Kernel times of the fused launch (launcher's threads and more
# per row) against mx.fast.rms_norm + the quantize, graphs off.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s14_g}
mkdir -p "$O"
MLX_USE_CUDA_GRAPHS=0 timeout 150 python3 bench/norm_variants.py --m 16,128,512,2048 --k 4096 \
  > "$O/norm_variants.log" 2>&1
echo "rc=$?"; grep -vE "UserWarning|_warn_once" "$O/norm_variants.log"
