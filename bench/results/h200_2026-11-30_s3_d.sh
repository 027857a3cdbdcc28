#!/bin/bash
# Device run D, third set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s3_d.sh
# The shipped table re-measured with the tree's kernels (predicated ws copies, run C;
# header split: every CUDA digest changed): prefill buckets, then M = 1, 8 with the
# decode check; then the model benchmark (4 Llama-3-8B layers) with that table.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s3_d}
mkdir -p "$O"
T="$O/nvidia-h200.json"
timeout -s INT 230 python3 -m mlx_w8a8.tune --model llama-3-8b --m 16,64,128,512,2048 --pairs 10 \
  --table "$T" --no-progress > "$O/tune_prefill.log" 2>&1
echo "tune prefill rc=$?"; tail -2 "$O/tune_prefill.log"
timeout -s INT 110 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8 --pairs 10 \
  --table "$T" --no-progress > "$O/tune_decode.log" 2>&1
echo "tune decode rc=$?"; grep -A8 "decode check" "$O/tune_decode.log"
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -8 "$O/model.log"
