#!/bin/bash
# Device run A, twenty-fourth set (2026-12-02; NVIDIA H200, MLX 0.32.4 CUDA build); written
# in the twenty-third set as its run F, not run then. Ran from branch direct-first-call (a plan's first call at a shape launches directly,
# no mx.compile trace; cuda_launch.LaunchSpec.bound, nn._Stages), with main's package at
# the branch point in .base/ (git archive main mlx_w8a8 | tar -x -C .base; carry .base):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s24_a.sh
# The branch changes candidate code, so its copy of the shipped table is stale (every
# digest differs): the A/B forces one kernel everywhere (--kernel cuda_w8a8_gemm_tma) on
# both trees, in alternating processes (branch, main, branch, main): the steady-state
# prefill rows and the --new-lengths rows (each timed call a length not run before). Then
# main with its shipped table, --new-lengths and 32 decode steps: what a user of main meets
# at new lengths, and main's first model run with the warm-up fix (08da8f5).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s24_a}
mkdir -p "$O/f"
model() {
  (cd "$1" && timeout 110 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 \
    --tokens 128,512,2048 --decode ${4:-0} --rounds 6 --new-lengths $3 --json "$O/f/$2.jsonl") \
    > "$O/f/$2.log" 2>&1
  echo "model $2 rc=$?"; grep -E "^(prefill|decode)" "$O/f/$2.log"
}
K="--kernel cuda_w8a8_gemm_tma"
model . branch1 "$K"
model .base main1 "$K"
model . branch2 "$K"
model .base main2 "$K"
model .base main_shipped "" 32
tar -C "$O" -czf "$O/s24_a.tgz" f && rm -rf "$O/f"
