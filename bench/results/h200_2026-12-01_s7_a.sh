#!/bin/bash
# Device run A, seventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s7_a.sh
# Where the W8A8 model's host time goes: MLX's per-launch custom-kernel cost against the
# length of the kernel text (inline, or read by NVRTC through #include), then the build /
# eval split of 4 Llama-3-8B layers on the shipped table with a cProfile of the build.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s7_a}
mkdir -p "$O"
timeout 150 python3 bench/custom_kernel_cost.py --sizes 0,8192,32768 --launches 200 --rounds 10 \
  > "$O/kernel_cost.log" 2>&1
echo "kernel cost rc=$?"; cat "$O/kernel_cost.log"
timeout 240 python3 bench/model_host_cost.py --model llama-3-8b --layers 4 --tokens 128,512 \
  --rounds 8 --table mlx_w8a8/tables/nvidia-h200.json --profile 10 --out "$O/host_cost.jsonl" \
  > "$O/host_cost.log" 2>&1
echo "host cost rc=$?"; head -8 "$O/host_cost.log"
