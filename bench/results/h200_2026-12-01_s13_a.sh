#!/bin/bash
# Device run A, thirteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s13_a.sh
# Small M, three views before any kernel change: (1) the model's prefill at T = 16-128
# (4 Llama-3-8B layers, the shipped table) against bf16 and mlx-lm 8-bit; (2) linears in
# chains whose launches feed each other (chain_timeline --linear, 4096 x 4096: the
# `feed` rows), against the independent chains the tuner times; (3) the narrow tiles'
# GPU time against their ring depth (tile_gpu_time --stages, graphs off).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s13_a}
mkdir -p "$O"
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 16,32,64,128 --decode 32 \
  --rounds 6 --json "$O/model_small.jsonl" > "$O/model_small.log" 2>&1
echo "model rc=$?"; tail -9 "$O/model_small.log"
timeout 150 python3 bench/chain_timeline.py --linear --m 16,64,128 --kn 4096x4096 --chain 32 \
  > "$O/linear_feed.log" 2>&1
echo "linear rc=$?"; grep -E "^(M=|MLX|arm|  )" "$O/linear_feed.log" | head -60; grep -iE "error|Traceback" "$O/linear_feed.log" | head -5
MLX_USE_CUDA_GRAPHS=0 timeout 150 python3 bench/tile_gpu_time.py --m 16,64,128 \
  --kn 4096x4096,4096x14336 --tiles ws32p4,tma32,tma64 --stages 3,5,7 --reps 5 > "$O/tiles_stages.log" 2>&1
echo "stages rc=$?"; grep -E "^(M=|MLX)" "$O/tiles_stages.log"; grep -iE "error|Traceback" "$O/tiles_stages.log" | head -5
