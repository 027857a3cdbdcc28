#!/bin/bash
# Device run H, seventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s7_h.sh
# Small M, where the model loses to bf16 (T = 128) and W8A8 to mx.quantized_matmul: every
# ws / TMA tile forced (the GEMM + epilogue on quantized activations) against the tile the
# launchers pick, the quantize, qmm and bf16, on the attention shapes at M = 16, 64, 128.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s7_h}
mkdir -p "$O"
timeout 300 python3 bench/cuda_bench.py --m 16,64,128 --kn 4096x4096,4096x1024 --variants --pairs 8 \
  --arms "qmm,bf16,quant,w8a8_tma,w8a8_mm_ws,w8a8_mm_tma,w8a8_mm[ws256p4],w8a8_mm[ws128p4],w8a8_mm[ws64p4],w8a8_mm[ws32p4],w8a8_mm[tma256],w8a8_mm[tma128]" \
  --out "$O" > "$O/bench.log" 2>&1
echo "bench rc=$?"; tail -30 "$O/bench.log" | cut -c1-400
