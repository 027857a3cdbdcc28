#!/bin/bash
# Device run B, sixteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s16_b.sh
# Ran the working tree = main plus the straight-line quantize path alone (run A's
# base:straight1, 80 registers). tmp_v/main: main's quantize.cu / .cuh; tmp_v/r72 and
# tmp_v/r64: the working tree's text with __maxnreg__(72) / (64) on the generated kernel
# (redefining __global__ in the header; ptxas: 12 / 72 bytes spilled in rowsum bf16).
# 72 registers give 14 blocks of 64 threads per SM (main's), 64 give 16 (one wave at
# M = 2048). Kernel time, graphs off, against astype(int8) and the copy floor.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s16_b}
mkdir -p "$O"
MLX_USE_CUDA_GRAPHS=0 timeout 250 python3 bench/quantize_variants.py --base tmp_v/main,tmp_v/r72,tmp_v/r64 \
  --no-shapes --m 512,2048,8192 --k 4096,14336 --rounds 7 > "$O/variants.log" 2>&1
echo "variants rc=$?"; grep -vE "UserWarning|_warn_once" "$O/variants.log"
