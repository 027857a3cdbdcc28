#!/bin/bash
# Device run C, twelfth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s12_c.sh
# gemm_ws.cu changed (the TMA A box of min(M, 128) rows, accumulator sets on 128 x 32):
# the shipped table re-tuned at M = 128, 512, 2048 with the sibling and prefill checks,
# then at M = 1 and 8 with the decode check.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s12_c}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 300 python3 -m mlx_w8a8.tune --model llama-3-8b --m 128,512,2048 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -E "^ *(128|512|2048) " "$O/tune.log" | cut -c1-200
grep -iE -A12 "check \(|interrupted|skipped|problem\(s\) in" "$O/tune.log" | cut -c1-220 | head -40
timeout -s INT 230 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8 --pairs 8 \
  --table "$T" --no-progress > "$O/tune18.log" 2>&1
echo "tune 1,8 rc=$?"; grep -iE -A9 "check \(|interrupted|problem\(s\) in" "$O/tune18.log" | cut -c1-200 | head -30
