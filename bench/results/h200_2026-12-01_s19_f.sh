#!/bin/bash
# Device run F, nineteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s19_f.sh
# Ran branch tma-coop at commit cbe6945 with run E's table (its M = 16-2048 entries
# re-measured) as bench/results/h200_2026-12-01_s19_e_nvidia-h200.json:
#  1. M = 1 and 8 re-measured into it as the sixteenth set's run C did (--force, 8 pairs,
#     the decode check on all 32 layers);
#  2. the model on the resulting table: 4 Llama-3-8B layers, prefill T = 128, 512, 2048
#     and decode, against bf16 and mlx-lm 8-bit (run B measured the shipped table).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s19_f}
mkdir -p "$O"
cp bench/results/h200_2026-12-01_s19_e_nvidia-h200.json "$O/tune.json"
timeout -s INT 200 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 1,8 --pairs 8 \
  --check-layers 32 --table "$O/tune.json" --no-progress > "$O/tune18.log" 2>&1
echo "tune rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune18.log" | tail -20
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 \
  --decode 32 --rounds 6 --table "$O/tune.json" --json "$O/model4.jsonl" > "$O/model4.log" 2>&1
echo "model4 rc=$?"; tail -n 9 "$O/model4.log"
