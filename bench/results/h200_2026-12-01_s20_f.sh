#!/bin/bash
# Device run F, twentieth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s20_f.sh
# Ran main at commit fab117e with run D's table as mlx_w8a8/tables/nvidia-h200.json and
# the package of commit 8b3caf4 in .base/, as run E. Run E's re-measured table, its M = 1
# and 8 log and two of its model logs did not come back (more files than one call
# returns), so: 1) M = 1 and 8 re-measured again into run D's table, as run E did;
# 2) a third pair of model runs (new, old). Outputs in one archive.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s20_f}
W=$(mktemp -d)
timeout -s INT 150 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 1,8 --pairs 8 \
  --check-layers 32 --table mlx_w8a8/tables/nvidia-h200.json --no-progress > "$W/tune18.log" 2>&1
echo "tune rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$W/tune18.log" | tail -8
cp mlx_w8a8/tables/nvidia-h200.json "$W/nvidia-h200.json"
model() {
  (cd "$1" && timeout 110 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 \
    --tokens 128,512,2048 --decode 32 --rounds 6 --json "$W/model4_$2.jsonl") > "$W/model4_$2.log" 2>&1
  echo "model $2 rc=$?"; grep -E "^(prefill|decode)" "$W/model4_$2.log"
}
model . new3
model .base old3
tar -C "$W" -cf "$O/s20_f.tar" .
