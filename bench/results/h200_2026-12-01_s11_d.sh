#!/bin/bash
# Device run D, eleventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s11_d.sh
# Do the tuner's and the bench's chains of independent launches overlap on the GPU at
# small M? (Run C: mx.quantized_matmul at M = 16 on 4096 x 4096 took 41.4 us of GPU time
# per call evaluated alone, 19.3 us per call in the bench's chains.) Whole linears (bf16,
# qmm, W8A8 on the TMA and cp.async ws GEMMs as a Linear runs them) in independent
# chains and in chains made dependent with mx.depends, CUDA graphs on and off.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s11_d}
mkdir -p "$O"
timeout 200 python3 bench/chain_timeline.py --linear --m 16,128,512 \
  --kn 4096x4096,4096x1024,4096x14336 --chain 32 > "$O/linear.log" 2>&1
echo "linear rc=$?"; grep -E "^(M=|MLX)" "$O/linear.log"; grep -iE "error|Traceback" "$O/linear.log" | head -5
MLX_USE_CUDA_GRAPHS=0 timeout 120 python3 bench/chain_timeline.py --linear --m 16,128 \
  --kn 4096x4096 --chain 32 > "$O/linear_nographs.log" 2>&1
echo "nographs rc=$?"; grep -E "^(M=|MLX)" "$O/linear_nographs.log"
