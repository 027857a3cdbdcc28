#!/bin/bash
# Device run C, thirtieth set. Tree: branch quantize-one-output with run B's re-measured
# table in mlx_w8a8/tables/nvidia-h200.json (the package as it would merge):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s30_c.sh
# 1) the 4-layer Llama-3-8B-shaped model with --new-lengths after mlx_w8a8.warm_up;
# 2) `bench --cider` on the table's own decisions at M = 2048 (4096 x 4096 and two MLP
#    shapes) and M = 512 on 4096 x 4096.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s30_c}
mkdir -p "$O"
timeout 200 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 6 --new-lengths --warm-up --json "$O/model4.jsonl" > "$O/model4.log" 2>&1
echo "model4 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model4.log"
timeout 70 python3 -m mlx_w8a8.bench --cider --shapes 2048x4096x4096 2048x14336x4096 2048x4096x14336 \
  512x4096x4096 --pairs 30 --json "$O/cider.jsonl" > "$O/cider.log" 2>&1
echo "cider rc=$?"; tail -n 5 "$O/cider.log"
