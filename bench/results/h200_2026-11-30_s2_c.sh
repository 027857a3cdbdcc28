#!/bin/bash
# Device run C, second set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s2_c.sh
# 1. the model benchmark with the shipped table as it is in this tree (no --table);
# 2. the same with lm_head and down_proj kept on W8A16 (the mixed policy of
#    docs/accuracy.md); 3. python -m mlx_w8a8.check.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s2_c}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1
timeout 170 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 1,128,512,2048 --decode 32 \
  --rounds 6 --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -9 "$O/model.log"
timeout 120 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,2048 --decode 32 \
  --rounds 6 --skip lm_head down_proj --json "$O/mixed.jsonl" > "$O/mixed.log" 2>&1
echo "mixed bench rc=$?"; tail -6 "$O/mixed.log"
timeout 240 python3 -m mlx_w8a8.check > "$O/check.log" 2>&1
echo "check rc=$?"; tail -30 "$O/check.log"
