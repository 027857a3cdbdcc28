#!/bin/bash
# Device run G, second set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s2_g.sh
# The decode check again, with its stricter rule (20 rounds x 32 steps, the tuned kernel
# must win three rounds of four), on the table of run F (every entry fresh: nothing is
# measured, the check judges the M = 1 GEMV choices); then decode with the result.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s2_g}
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 100 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8 --pairs 12 \
  --table "$T" --no-progress > "$O/tune_decode.log" 2>&1
echo "tune decode rc=$?"; grep -A8 "decode check" "$O/tune_decode.log"
timeout 90 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 1 --decode 64 \
  --rounds 10 --table "$T" --json "$O/decode.jsonl" > "$O/decode.log" 2>&1
echo "decode bench rc=$?"; tail -5 "$O/decode.log"
