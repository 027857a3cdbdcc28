#!/bin/bash
# Device run D, second set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s2_d.sh
# 1. the CUDA tests (bound launches included); 2. decode again with more steps and
#    rounds, shipped table as in this tree.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s2_d}
timeout 110 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 1 --decode 64 \
  --rounds 10 --json "$O/decode.jsonl" > "$O/decode.log" 2>&1
echo "decode bench rc=$?"; tail -5 "$O/decode.log"
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 16 tests/test_cuda.py > "$O/cuda_tests.log" 2>&1
echo "cuda tests rc=$?"; tail -2 "$O/cuda_tests.log"; grep -E "^FAILED|^ERROR" "$O/cuda_tests.log" | head -10
