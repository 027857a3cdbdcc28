#!/bin/bash
# Device run D, thirteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s13_d.sh
# The final tree: every CUDA test, then the 4-layer model on the shipped table (10 rounds).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s13_d}
mkdir -p "$O"
timeout 330 python3 -m pytest -q -n 4 tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$O/tests.log"; grep -E "^FAILED|^ERROR" "$O/tests.log" | head -20
timeout 170 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 16,32,128,512,2048 --decode 32 \
  --rounds 10 --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model rc=$?"; tail -9 "$O/model.log"
