#!/bin/bash
# Device run E, twenty-fourth set (2026-12-02; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s24_e.sh
# Ran main at the commit that adds this script (registry.decide keeps its decisions;
# mlx_w8a8.warm_up). 1) the 4-layer graph build at 20 new lengths, as run D (the shipped
# table there: 12.1 ms against bf16's 0.5); 2) bench/first_call.py --warm-up: warm_up's
# wall time, then first prefills at new lengths and regimes, which should compile
# nothing; 3) the 32-layer model on the shipped table (last run in the seventeenth set),
# prefill at T = 128 / 512 / 2048 as the bench's steady state and at new lengths, decode.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s24_e}
mkdir -p "$O/e"
timeout 90 python3 bench/new_length_build.py --layers 4 --t 129 --count 20 \
  > "$O/e/build_shipped.log" 2>&1
echo "build rc=$?"; head -3 "$O/e/build_shipped.log"
timeout 120 python3 bench/first_call.py --layers 4 --lengths 128,129,130,512,515,2048,2051 \
  --warm-up --out "$O/e/first_warm.jsonl" > "$O/e/first_warm.log" 2>&1
echo "first_call --warm-up rc=$?"; grep -E "^(bf16|mlx_w8a8|llama|warm_up)" "$O/e/first_warm.log"
timeout 330 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 128,512,2048 \
  --decode 32 --rounds 4 --new-lengths --json "$O/e/model32.jsonl" > "$O/e/model32.log" 2>&1
echo "model32 rc=$?"; grep -E "^(prefill|decode)" "$O/e/model32.log"
tar -C "$O" -czf "$O/s24_e.tgz" e && rm -rf "$O/e"
