#!/bin/bash
# Device run E, sixteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s16_e.sh
# The final tree (run D's): every CUDA test, then the 32-layer decode again with 8
# rounds (run D's 4 rounds spread 0.76..0.99x mlx-lm 8-bit; run A's 6 rounds of main
# before this set 0.97..1.01x; both tables run mx.quantized_matmul at every M = 1 layer).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s16_e}
mkdir -p "$O"
timeout 330 python3 -m pytest -q -n 4 tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head
timeout 220 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 1 --decode 32 \
  --rounds 8 --json "$O/decode32.jsonl" > "$O/decode32.log" 2>&1
echo "32-layer decode rc=$?"; tail -n 6 "$O/decode32.log"
