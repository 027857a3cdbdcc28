#!/bin/bash
# Device run E, fifth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s5_e.sh
# Run D's table (34 of 35 entries; its tune was cut before the model checks): lm_head at
# M = 2048, then the decode check (M = 1) and the sibling check (M = 128, 512, 2048) on
# the checks' model; then the model bench with the checked table, paired.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s5_e}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 250 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8,128,512,2048 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A9 "check|interrupted" "$O/tune.log" | cut -c1-200 | head -45
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -8 "$O/model.log"
