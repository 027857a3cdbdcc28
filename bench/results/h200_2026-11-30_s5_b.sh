#!/bin/bash
# Device run B, fifth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s5_b.sh
# Run A (h200_2026-11-30_s5_a.sh; its -k "tma" selected the whole file): 297 CUDA tests
# passed, 2 failed on a test defect (a loop variable shadowing the kernel parameter).
# Here: those two again, the TMA/cp.async bit-identity test, then the TMA arms against
# the cp.async ones, bf16 and cuBLASLt, paired.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s5_b}
mkdir -p "$O"
timeout 150 python3 -m pytest -q -rs -n 8 -p no:cacheprovider tests/test_cuda.py \
  -k "test_linear_siblings_run_as_one_launch_on_the_gpu or test_tma_producer_matches_cp_async" \
  > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$O/tests.log"
timeout 300 python3 bench/cuda_bench.py --m 512,2048 --kn 4096x4096,14336x4096,4096x14336 \
  --arms bf16,w8a8_ws,w8a8_tma,w8a8_mm_ws,w8a8_mm_tma,i8gemm_ws,i8gemm_tma,torch \
  --pairs 8 --out "$O" > "$O/bench.log" 2>&1
echo "bench rc=$?"; tail -9 "$O/bench.log"
