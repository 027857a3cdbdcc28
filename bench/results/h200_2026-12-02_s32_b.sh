#!/bin/bash
# Device run B, thirty-second set. Tree: branch tma-own-maps as run A (its tests passed:
# 453 of 453). The shipped table re-measured (every CUDA candidate's digest changed), as
# the thirtieth set's run B did: M = 1 and 8 with the decode check, then M = 2048 ... 16
# with the sibling and prefill checks, keep-choices rule on:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s32_b.sh
# Outcome: 4 entries updated at M = 1 / 8 (the decode check replaced four GEMV choices by
# mlx_qmm), 17 at M >= 16; the table is mlx_w8a8/tables/nvidia-h200.json as merged.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s32_b}
mkdir -p "$O" tmp_t
cp mlx_w8a8/tables/nvidia-h200.json tmp_t/branch.json
timeout -s INT 230 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 1,8 --pairs 8 \
  --check-layers 32 --table tmp_t/branch.json --no-progress > "$O/tune_m1.log" 2>&1
echo "tune m1 rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune_m1.log" | tail -6
cp tmp_t/branch.json "$O/branch_m1_nvidia-h200.json"
timeout -s INT 230 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 2048,512,128,64,16 \
  --table tmp_t/branch.json --no-progress > "$O/tune_m16.log" 2>&1
echo "tune m16 rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune_m16.log" | tail -6
cp tmp_t/branch.json "$O/branch_nvidia-h200.json"
cp "$O/tune_m16.log" "$O/tune_m16_copy.txt"
