#!/bin/bash
# Device run E, third set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s3_e.sh
# The tree's kernels (predicated ws copies, header split, narrow ws tiles): the whole CUDA
# suite, then the W8A8 linear and the raw int8 GEMM against bf16 / cuBLASLt at M = 512, 2048.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s3_e}
mkdir -p "$O"
timeout 150 python3 -m pytest -q -rs -p no:cacheprovider -n 16 tests/test_cuda.py > "$O/cuda_tests.log" 2>&1
echo "cuda tests rc=$?"; tail -1 "$O/cuda_tests.log"; grep -E "^FAILED|^ERROR" "$O/cuda_tests.log" | head -20
ARMS="bf16,qmm,w8a8,w8a8_ws,quant,i8gemm[ws256p4],torch"
timeout 150 python3 bench/cuda_bench.py --variants --kn 4096x4096,4096x1024,14336x4096,4096x14336 --m 512,2048 \
  --pairs 6 --arms "$ARMS" --out "$O" > "$O/bench.log" 2>&1
echo "bench rc=$?"; grep -hE "^M=" "$O/bench.log" | cut -c1-330
