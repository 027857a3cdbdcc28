#!/bin/bash
# Device run D, fifth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s5_d.sh
# Completes run C's table (the package's copy, 19 of 21 prefill entries): decode buckets
# M = 1, 8 with the decode check, lm_head at M = 512 and 2048, and the sibling check at
# the prefill buckets (fresh entries are skipped); then the 4-layer Llama-3-8B model
# bench with that table, paired against bf16 and mlx-lm 8-bit.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s5_d}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 300 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8,128,512,2048 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A8 "check|interrupted|saved" "$O/tune.log" | cut -c1-200 | head -40
timeout 170 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -9 "$O/model.log"
