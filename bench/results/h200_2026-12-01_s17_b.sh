#!/bin/bash
# Device run B, seventeenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s17_b.sh
# Ran main with folders of experimental quantize text (deleted after the run):
#   tmp_v/main        main's quantize.cu / quantize.cuh;
#   tmp_v/pf{6,12,24} main plus, in quantize_row, thread 0 of each block issuing an L2 bulk
#                     prefetch (cp.async.bulk.prefetch.L2) of the row 6 / 12 / 24 MiB of x
#                     ahead of its own, so rows of the grid's later waves are on their way
#                     while the first wave computes.
# Kernel time, graphs off, against astype(int8) and the copy floor; every arm's bits
# compared with the shipped launch first.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s17_b}
mkdir -p "$O"
MLX_USE_CUDA_GRAPHS=0 timeout 200 python3 bench/quantize_variants.py \
  --base tmp_v/main,tmp_v/pf6,tmp_v/pf12,tmp_v/pf24 \
  --no-shapes --m 512,2048,4096,8192 --k 4096,14336 --rounds 7 > "$O/variants.log" 2>&1
echo "variants rc=$?"; grep -vE "UserWarning|_warn_once" "$O/variants.log"
