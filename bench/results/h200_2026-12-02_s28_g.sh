#!/bin/bash
# Device run G, twenty-eighth set. Tree: branch quantize-tie-free with run F's table
# (bench/results/h200_2026-12-02_s28_f_branch_nvidia-h200.json) as
# mlx_w8a8/tables/nvidia-h200.json: the 4-layer model on the tie-free quantize and its
# re-measured table (the device time left allowed no --new-lengths rows):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s28_g.sh
set -u
O=${OUT:-/tmp/s28_g}
mkdir -p "$O"
timeout 185 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 6 --warm-up --json "$O/model4.jsonl" > "$O/model4.log" 2>&1
echo rc=$?; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model4.log"
