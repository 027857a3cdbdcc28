#!/bin/bash
# Device run D, fourth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s4_d.sh
# Run C's new tests failed only where outputs hold NaN (activation()'s special rows:
# mx.array_equal treats NaN as unequal); with equal_nan=True, again. Then the host-cost
# split of the prefill with the shipped table (runs B + C).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s4_d}
mkdir -p "$O"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "sibling or leading_shape" \
  > "$O/cuda_tests_siblings.log" 2>&1
echo "cuda tests rc=$?"; tail -4 "$O/cuda_tests_siblings.log"
timeout 100 python3 bench/model_host_cost.py --model llama-3-8b --layers 4 --tokens 128,512 \
  --rounds 6 --out "$O/host_cost.jsonl" > "$O/host_cost.log" 2>&1
echo "host cost rc=$?"; cat "$O/host_cost.log"
