#!/bin/bash
# Device run D, tenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s10_d.sh
# Every CUDA test on the final tree (run B's TMA selection was cut by its time limit),
# then the raw int32 GEMM and the W8A8 linear on the TMA kernel's own tile choice
# (tma_tile_for) against torch._int_mm and bf16, paired.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s10_d}
mkdir -p "$O"
N=""
python3 -c "import xdist" 2>/dev/null && N="-n 4"
timeout 320 python3 -m pytest -q -p no:cacheprovider $N tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
timeout 110 python3 bench/cuda_bench.py --arms bf16,torch,i8gemm_tma,w8a8_tma,w8a8_mm_tma --m 2048,8192 \
  --kn 4096x4096,4096x14336,14336x4096 --pairs 8 --out "$O" > "$O/bench.log" 2>&1
echo "bench rc=$?"; grep -E "^M=" "$O/bench.log" | cut -c1-300
