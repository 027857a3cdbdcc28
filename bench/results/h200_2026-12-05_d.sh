#!/bin/bash
# Device run D, 2026-12-05: mlx-lm 8-bit checkpoints, the default path.
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-05_d.sh
# 1) tune the grouped format (gs64) at M = 1, 8 with the decode check on all 32 layers, on
#    a copy of the shipped table (which lacks grouped M = 1 entries: decode borrowed the
#    M = 16 ones);
# 2) the 4-layer bench from an 8-bit gs64 checkpoint with that table: T = 2048, decode
#    B = 1 and B = 16;
# 3) gs32 and gs128 checkpoints with no table entry of their group size (the CUDA prior's
#    grouped rule): T = 2048.
# Everything appends to one log, d.log.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/h200_d}
mkdir -p "$O" tmp_t
L="$O/d.log"
cp mlx_w8a8/tables/nvidia-h200.json tmp_t/g.json
run() { echo "===== $*" >> "$L"; "$@" >> "$L" 2>&1; echo "rc=$?" >> "$L"; }
run timeout -s INT 215 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped --group-size 64 \
  --m 1,8 --pairs 8 --check-layers 32 --table tmp_t/g.json --no-progress
cp tmp_t/g.json "$O/d_m1_nvidia-h200.json"
run timeout 140 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs64 --layers 4 \
  --tokens 2048 --decode 32 --batch 16 --rounds 4 --warm-up --table tmp_t/g.json
for gs in 32 128; do
  run timeout 95 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs$gs --layers 4 \
    --tokens 2048 --decode 0 --batch 0 --rounds 3 --warm-up
done
grep -E "^(=====|prefill|decode|rc=|mlx_w8a8.warm_up|  M=|[0-9]+ entries)" "$L"
