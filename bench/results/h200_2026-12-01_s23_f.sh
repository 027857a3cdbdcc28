#!/bin/bash
# Device run F, twenty-third set (NVIDIA H200, MLX 0.32.4 CUDA build): written, NOT RUN yet.
# Run from branch direct-first-call (a plan's first call at a shape launches directly,
# no mx.compile trace; cuda_launch.LaunchSpec.bound, nn._Stages), with main's package at
# the branch point in .base/ (git archive main mlx_w8a8 | tar -x -C .base; carry .base):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s23_f.sh
# The branch changes candidate code, so its copy of the shipped table is stale (every
# digest differs): the A/B forces one kernel everywhere (--kernel cuda_w8a8_gemm_tma) on
# both trees, in alternating processes (branch, main, branch, main): the steady-state
# prefill rows and the --new-lengths rows (each timed call a length not run before). Then
# main with its shipped table, --new-lengths: what a user of main meets at new lengths.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s23_f}
mkdir -p "$O/f"
model() {
  (cd "$1" && timeout 95 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 \
    --tokens 128,512,2048 --decode 0 --rounds 6 --new-lengths $3 --json "$O/f/$2.jsonl") \
    > "$O/f/$2.log" 2>&1
  echo "model $2 rc=$?"; grep -E "^prefill" "$O/f/$2.log"
}
K="--kernel cuda_w8a8_gemm_tma"
model . branch1 "$K"
model .base main1 "$K"
model . branch2 "$K"
model .base main2 "$K"
model .base main_shipped ""
tar -C "$O" -czf "$O/s23_f.tgz" f && rm -rf "$O/f"
