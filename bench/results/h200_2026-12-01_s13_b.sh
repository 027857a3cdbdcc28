#!/bin/bash
# Device run B, thirteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s13_b.sh
# The tuner now times linears in dependent chains (timing.linear_link). The shipped
# table re-measured (--force: no kernel changed) with them at M = 16, 64, 128, 512, 2048
# (sibling and prefill checks), then at M = 1 and 8 (decode check). M = 16 and 64 are
# new buckets (a model's T = 16 ran the M = 8 entries, T = 32 and 64 the M = 128 ones).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s13_b}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 340 python3 -m mlx_w8a8.tune --model llama-3-8b --m 16,64,128,512,2048 --pairs 8 \
  --force --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -E "^ *(16|64|128|512|2048) " "$O/tune.log" | cut -c1-220
grep -iE -A12 "check \(|interrupted|skipped|problem\(s\) in" "$O/tune.log" | cut -c1-220 | head -40
timeout -s INT 200 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8 --pairs 8 \
  --force --table "$T" --no-progress > "$O/tune18.log" 2>&1
echo "tune 1,8 rc=$?"; grep -E "^ *(1|8) " "$O/tune18.log" | cut -c1-220
grep -iE -A9 "check \(|interrupted|problem\(s\) in" "$O/tune18.log" | cut -c1-200 | head -30
