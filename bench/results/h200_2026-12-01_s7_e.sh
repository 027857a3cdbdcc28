#!/bin/bash
# Device run E, seventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s7_e.sh
# Where a W8A8 layer's remaining host time goes: MLX's per-launch cost of template
# arguments and of more inputs / outputs (one-line header), and one Llama-3-8B layer's
# seven projections built (not evaluated) with MLX's real custom-kernel calls, bf16 vs
# W8A8 linked / unlinked.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s7_e}
mkdir -p "$O"
timeout 120 python3 bench/custom_kernel_cost.py --sizes 0,32768 --launches 200 --rounds 10 \
  > "$O/kernel_cost.log" 2>&1
echo "kernel cost rc=$?"; cat "$O/kernel_cost.log"
timeout 150 python3 bench/layer_host_stub.py --real --hidden 4096 --inter 14336 --kv 1024 \
  --tokens 512 --blocks 20 --calls 100 --out "$O/layer_host_real.jsonl" > "$O/layer_host_real.log" 2>&1
echo "layer host rc=$?"; head -5 "$O/layer_host_real.log"
