#!/bin/bash
# Device run G, nineteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s19_g.sh
# Ran main at commit e54302c plus chain_timeline.py --quant-smem (committed after this run).
# In chains of W8A8 linears on 4096 x 4096 the GPU idles about 27 us per launch where
# bf16's idles 13 (runs B, C against the eighteenth set's kernel times). One suspect: the
# SM's L1 / shared-memory split, which the GEMM (nearly all shared memory) and the quantize
# (none) each want their own way. The W8A8 TMA linear with its quantize launched with 8 and
# 17 KiB of unused dynamic shared memory (12 blocks of 17 KiB ask for the GEMM's split),
# against the shipped launch and bf16, CUPTI with CUDA graphs on, M = 512 and 2048.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s19_g}
mkdir -p "$O"
timeout 300 python3 bench/chain_timeline.py --linear --m 512,2048 --kn 4096x4096 --chain 40 \
  --rounds 5 --quant-smem 8192,17408 > "$O/linear_smem.log" 2>&1
echo "rc=$?"; grep -E "^M=" "$O/linear_smem.log"
