#!/bin/bash
# Device run C, 2026-12-05: mlx-lm 8-bit group-wise checkpoints (Llama-3-8B shapes, gs64):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-05_c.sh
# 1) tune the grouped format at M = 2048 ... 16 into a copy of the shipped table (every
#    grouped candidate timed, the group-wise TMA GEMM included; sibling/prefill checks);
# 2) the 4-layer model bench from an 8-bit gs64 checkpoint with that table;
# 3) the per-channel 4-layer bench at T = 128 only, 8 rounds (confirms or not 1.00x).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/h200_c}
mkdir -p "$O" tmp_t
cp mlx_w8a8/tables/nvidia-h200.json tmp_t/g.json
timeout -s INT 240 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped --group-size 64 \
  --m 2048,512,128,16 --table tmp_t/g.json --no-progress > "$O/tune_g64.log" 2>&1
echo "tune rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune_g64.log" | tail -12
cp tmp_t/g.json "$O/g64_nvidia-h200.json"
timeout 200 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs64 --layers 4 \
  --tokens 512,2048 --decode 32 --rounds 4 --warm-up --table tmp_t/g.json \
  --json "$O/model4_g64.jsonl" > "$O/model4_g64.log" 2>&1
echo "model g64 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up|layer|kernel)" "$O/model4_g64.log"; tail -n 30 "$O/model4_g64.log"
timeout 110 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128 --decode 0 \
  --batch 0 --rounds 8 --warm-up > "$O/model4_t128.log" 2>&1
echo "model t128 rc=$?"; tail -n 12 "$O/model4_t128.log"
