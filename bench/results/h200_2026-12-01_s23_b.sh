#!/bin/bash
# Device run B, twenty-third set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s23_b.sh
# Ran main at commit 4a48829 (kernels and shipped table unchanged since the twenty-first
# set's run D). 1) the 4-layer Llama-3-8B model bench at this tree; 2) every test of
# tests/test_cuda.py with 8 workers (runs D-E of the twenty-first set, serial, reached 358
# of 435). Outputs in one archive.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s23_b}
mkdir -p "$O/b"
timeout 130 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 \
  --decode 32 --rounds 6 --json "$O/b/model4.jsonl" > "$O/b/model4.log" 2>&1
echo "model rc=$?"; tail -n 12 "$O/b/model4.log"
timeout 400 python3 -m pytest -q -n 8 -p no:cacheprovider --durations=10 tests/test_cuda.py \
  > "$O/b/tests_cuda.log" 2>&1
echo "cuda tests rc=$? (124: time limit)"; tail -n 14 "$O/b/tests_cuda.log"; grep -E "^(FAILED|ERROR)" "$O/b/tests_cuda.log" | head
tar -C "$O" -czf "$O/s23_b.tgz" b && rm -rf "$O/b"
