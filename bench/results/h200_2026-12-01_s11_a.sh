#!/bin/bash
# Device run A, eleventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s11_a.sh
# Where a chain of raw int8 GEMM launches loses time against the kernels' own durations
# (ncu's 49.8 us for 4096 x 4096 at M = 2048 against the bench's 63.8 us per launch):
# bench/chain_timeline.py on the 8B and Qwen-7B MLP shapes with MLX's CUDA graphs on, a
# 200-launch chain, and graphs off; then cuda_bench on the Qwen shapes (not yet measured
# on the TMA tiles).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s11_a}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
S="4096x4096,4096x14336,14336x4096,3584x18944,18944x3584"
timeout 150 python3 bench/chain_timeline.py --m 2048,8192 --kn $S --tiles tma256,tma128pp \
  --chain 40 > "$O/chain.log" 2>&1
echo "chain rc=$?"; grep -E "^(M=|MLX)" "$O/chain.log"; grep -iE "error|Traceback" "$O/chain.log" | head -5
timeout 60 python3 bench/chain_timeline.py --m 2048 --kn 4096x4096 --tiles tma128pp --chain 200 \
  > "$O/chain200.log" 2>&1
echo "chain200 rc=$?"; grep -E "^(M=|MLX)" "$O/chain200.log"
MLX_USE_CUDA_GRAPHS=0 timeout 60 python3 bench/chain_timeline.py --m 2048 \
  --kn 4096x4096,4096x14336 --tiles tma128pp --chain 40 > "$O/chain_nographs.log" 2>&1
echo "nographs rc=$?"; grep -E "^(M=|MLX)" "$O/chain_nographs.log"
timeout 200 python3 bench/cuda_bench.py --arms bf16,torch,i8gemm_tma,w8a8_tma,w8a8_mm_tma \
  --m 2048,8192 --kn 3584x18944,18944x3584 --pairs 8 --out "$O" > "$O/bench.log" 2>&1
echo "bench rc=$?"; grep -A12 "i8gemm_tma us (TOPS" "$O/bench.log" | head -10
