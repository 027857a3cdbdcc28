#!/bin/bash
# Device run E, sixth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s6_e.sh
# With run B's kernels (the shipped ones): the attention shapes at M = 16-128 against
# mx.quantized_matmul 8-bit (the W8A8 GEMMs with their quantize, the GEMV at M = 16),
# then the Qwen2.5-7B MLP shapes at M = 2048 (int32 GEMM vs torch._int_mm, linear vs bf16).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s6_e}
mkdir -p "$O/small" "$O/qwen"
timeout 200 python3 bench/cuda_bench.py --m 16,64,128 --kn 4096x1024,4096x4096 \
  --arms qmm,bf16,w8a8,w8a8_ws,w8a8_tma,gemv --pairs 8 --out "$O/small" > "$O/small.log" 2>&1
echo "small rc=$?"; grep -A9 "^| M | K x N | qmm" "$O/small.log" | head -9
grep -A9 "^| M | K x N | bf16 us | w8a8 us | w8a8_ws" "$O/small.log" | cut -d'|' -f1-4,13 | head -9
timeout 200 python3 bench/cuda_bench.py --m 2048 --kn 3584x18944,18944x3584 \
  --arms bf16,w8a8_tma,i8gemm_tma,torch --pairs 8 --out "$O/qwen" > "$O/qwen.log" 2>&1
echo "qwen rc=$?"; grep -A4 "^| M | K x N | bf16 us | w8a8_ws us | w8a8_tma" "$O/qwen.log"
