#!/bin/bash
# Device run A, seventeenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s17_a.sh
# Ran main (the sixteenth set's kernels) with folders of experimental quantize text
# (deleted after the run; described in docs/cuda.md, seventeenth set):
#   tmp_v/main  main's quantize.cu / quantize.cuh;
#   tmp_v/wp    rowsum_warp (one warp per row) with its loads issued unconditionally and
#               a straight-line branch where the warp's 16 chunks per lane hold the row
#               (K = 4096 bfloat16), as quantize_row's;
#   tmp_v/mob   main without the block max's second barrier (its slots are not reused);
#   tmp_v/mobg  mob with read-only-path loads (__ldg).
# Kernel time, graphs off, against astype(int8) and the copy floor; every arm's bits
# compared with the shipped launch first.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s17_a}
mkdir -p "$O"
MLX_USE_CUDA_GRAPHS=0 timeout 200 python3 bench/quantize_variants.py \
  --base tmp_v/main,tmp_v/wp,tmp_v/mob,tmp_v/mobg --warp-threads 64,128,256 \
  --no-shapes --m 512,2048,8192 --k 4096 --rounds 7 > "$O/variants.log" 2>&1
echo "variants rc=$?"; grep -vE "UserWarning|_warn_once" "$O/variants.log"
MLX_USE_CUDA_GRAPHS=0 timeout 120 python3 bench/quantize_variants.py \
  --base tmp_v/main,tmp_v/mob,tmp_v/mobg \
  --no-shapes --m 512,2048,8192 --k 14336 --rounds 7 > "$O/variants14k.log" 2>&1
echo "variants14k rc=$?"; grep -vE "UserWarning|_warn_once" "$O/variants14k.log"
