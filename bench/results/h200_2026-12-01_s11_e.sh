#!/bin/bash
# Device run E, eleventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s11_e.sh
# The final tree: every CUDA test; then python -m mlx_w8a8.bench, whose arms now run a
# kernel as a Linear does (bound launches), at M = 16-128 on the four Llama-3-8B
# projection shapes: the W8A8 linear (TMA tile rule) against mx.quantized_matmul 8-bit,
# and the shipped table's choice against it.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s11_e}
mkdir -p "$O"
N=""
python3 -c "import xdist" 2>/dev/null && N="-n 4"
timeout 330 python3 -m pytest -q -p no:cacheprovider $N tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
timeout 150 python3 -m mlx_w8a8.bench --baseline mlx_qmm --candidate cuda_w8a8_gemm_tma \
  --cases 16x4096x4096 16x1024x4096 16x14336x4096 16x4096x14336 64x4096x4096 64x1024x4096 64x14336x4096 64x4096x14336 128x4096x4096 128x1024x4096 128x14336x4096 128x4096x14336 --pairs 30 --jsonl "$O/bench_tma.jsonl" > "$O/bench_tma.log" 2>&1
echo "bench tma rc=$?"; grep -vE "^\{" "$O/bench_tma.log" | tail -16
timeout 100 python3 -m mlx_w8a8.bench --baseline mlx_qmm --candidate-table mlx_w8a8/tables/nvidia-h200.json \
  --cases 16x4096x4096 16x1024x4096 16x14336x4096 16x4096x14336 64x4096x4096 64x1024x4096 64x14336x4096 64x4096x14336 128x4096x4096 128x1024x4096 128x14336x4096 128x4096x14336 --pairs 30 --jsonl "$O/bench_table.jsonl" > "$O/bench_table.log" 2>&1
echo "bench table rc=$?"; grep -vE "^\{" "$O/bench_table.log" | tail -16
