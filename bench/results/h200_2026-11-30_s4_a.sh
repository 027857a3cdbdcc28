#!/bin/bash
# Device run A, fourth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s4_a.sh
# Sibling launches (q/k/v and gate/up as one gemm_ws.cu group launch) and kernels reading
# x [..., K] as it comes (no reshape nodes): the CUDA suite, then the 4-layer
# Llama-3-8B model benchmark and its host-cost split. Every CUDA digest changed, so the
# shipped table's entries are stale here: decisions come from the prior.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s4_a}
mkdir -p "$O"
timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py > "$O/cuda_tests.log" 2>&1
echo "cuda tests rc=$?"; tail -15 "$O/cuda_tests.log"
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -12 "$O/model.log"
timeout 90 python3 bench/model_host_cost.py --model llama-3-8b --layers 4 --tokens 128,512 \
  --rounds 6 --out "$O/host_cost.jsonl" > "$O/host_cost.log" 2>&1
echo "host cost rc=$?"; cat "$O/host_cost.log"
