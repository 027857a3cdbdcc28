#!/bin/bash
# Device run D, 2026-12-05: mlx-lm 8-bit checkpoints of group sizes 32 and 128 on the
# default path (no --table: the shipped table has group-size-64 entries only, so the
# CUDA prior's grouped rule decides), 4-layer Llama-3-8B shapes:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-05_d.sh
# Both runs append to one log, d.log.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/h200_d}
mkdir -p "$O"
L="$O/d.log"
for gs in 32 128; do
  echo "===== python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs$gs --layers 4 --tokens 512,2048 --decode 32 --batch 0 --rounds 3 --warm-up" >> "$L"
  timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs$gs --layers 4 \
    --tokens 512,2048 --decode 32 --batch 0 --rounds 3 --warm-up >> "$L" 2>&1
  echo "rc=$?" >> "$L"
done
grep -E "^(=====|prefill|decode|rc=|mlx_w8a8.warm_up)" "$L"
