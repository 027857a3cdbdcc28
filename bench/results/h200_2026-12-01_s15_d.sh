#!/bin/bash
# Device run D, fifteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s15_d.sh
# The final tree: the FMA-remainder quantize (commit 636ba12) with the table run C
# re-measured. Every CUDA test, then the 4-layer Llama-3-8B model against bf16 and
# mlx-lm 8-bit (as the thirteenth set's run D: 10 rounds).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s15_d}
mkdir -p "$O"
timeout 330 python3 -m pytest -q -n 4 tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$O/tests.log"; grep -E "^FAILED|^ERROR" "$O/tests.log" | head -20
timeout 200 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 16,32,128,512,2048 --decode 32 \
  --rounds 10 --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model rc=$?"; tail -12 "$O/model.log"
