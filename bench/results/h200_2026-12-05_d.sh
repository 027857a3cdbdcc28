#!/bin/bash
# Device run D, 2026-12-05: the default path for mlx-lm 8-bit checkpoints (no --table: the
# shipped table with run C's group-size-64 entries, and the CUDA prior's grouped rule for
# other group sizes), 4-layer Llama-3-8B shapes, group sizes 64, 32, 128:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-05_d.sh
# All three runs append to one log, d_model4_gs.log.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/h200_d}
mkdir -p "$O"
L="$O/d_model4_gs.log"
for gs in 64 32 128; do
  echo "===== python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs$gs --layers 4 --tokens 512,2048 --decode 0 --batch 0 --rounds 4 --warm-up" >> "$L"
  timeout 170 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs$gs --layers 4 \
    --tokens 512,2048 --decode 0 --batch 0 --rounds 4 --warm-up >> "$L" 2>&1
  echo "rc=$?" >> "$L"
done
grep -E "^(=====|prefill|rc=|mlx_w8a8.warm_up)" "$L"
