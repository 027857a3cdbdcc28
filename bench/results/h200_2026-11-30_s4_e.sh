#!/bin/bash
# Device run E, fourth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s4_e.sh
# What the sibling launches save, paired in one run: the 4-layer Llama-3-8B prefill with
# the shipped table, mlx_w8a8 with q/k/v and gate/up as one launch per group vs the same
# model with each sibling run by itself (--unlinked), next to bf16 and mlx-lm 8-bit.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s4_e}
mkdir -p "$O"
timeout 210 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 0 \
  --rounds 6 --unlinked --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -7 "$O/model.log"
