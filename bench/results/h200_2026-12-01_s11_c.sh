#!/bin/bash
# Device run C, eleventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s11_c.sh
# Small and medium M on the tenth set's tiles (not re-measured since): every tile's GPU
# time (CUPTI, each call evaluated alone) with bf16, mx.quantized_matmul and the quantize
# kernel at M = 16-512 on the four Llama-3-8B projection shapes; then the W8A8 linear on
# its TMA tile rule against mx.quantized_matmul 8-bit in python -m mlx_w8a8.bench (wall
# clock, paired, host cost included) on the same shapes.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s11_c}
mkdir -p "$O"
timeout 200 python3 bench/tile_gpu_time.py --m 16,64,128,512 \
  --kn 4096x4096,4096x1024,4096x14336,14336x4096 --reps 5 > "$O/tile_gpu_time.log" 2>&1
echo "tile_gpu_time rc=$?"; grep -E "^(M=|MLX)" "$O/tile_gpu_time.log"; grep -iE "error|Traceback" "$O/tile_gpu_time.log" | head -5
timeout 300 python3 -m mlx_w8a8.bench --baseline mlx_qmm --candidate cuda_w8a8_gemm_tma \
  --cases 16x4096x4096 16x1024x4096 16x14336x4096 16x4096x14336 64x4096x4096 64x1024x4096 64x14336x4096 64x4096x14336 128x4096x4096 128x1024x4096 128x14336x4096 128x4096x14336 512x4096x4096 512x1024x4096 512x14336x4096 512x4096x14336 --pairs 30 --jsonl "$O/bench.jsonl" > "$O/bench.log" 2>&1
echo "bench rc=$?"; grep -vE "^\{" "$O/bench.log" | tail -25
