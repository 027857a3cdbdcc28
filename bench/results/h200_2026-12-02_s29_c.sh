#!/bin/bash
# Device run C, twenty-ninth set. Tree: main at 05d17a6 plus bench/custom_kernel_cost.py's
# --io arms (no package change):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s29_c.sh
# What a W8A8 linear's host time per call is made of, against bf16's, at M = 2048 on
# 4096 x 4096 (runs A-B: about 4-8 us per call more than bf16's in the wall clock, where
# its GPU time is 1.5x shorter):
# 1) bench/host_split.py: Python build, MLX encode and GPU wait per launch, chains of 40;
# 2) bench/custom_kernel_cost.py --io: the host cost of an mx.fast.cuda_kernel launch by
#    the number of arrays it names (a W8A8 linear's quantize names 4, its TMA GEMM 8,
#    bf16's matmul 3).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s29_c}
mkdir -p "$O"
timeout 120 python3 bench/host_split.py --m 2048 --chain 40 --rounds 7 > "$O/host_split.log" 2>&1
echo "host split rc=$?"; grep -E "^M=" "$O/host_split.log"
timeout 150 python3 bench/custom_kernel_cost.py --sizes 0 --io 1x1,2x1,4x1,8x1,1x2,1x4,1x3,7x2 \
  --launches 200 --rounds 10 > "$O/kernel_cost.log" 2>&1
echo "kernel cost rc=$?"; cat "$O/kernel_cost.log"
