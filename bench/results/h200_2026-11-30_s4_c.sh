#!/bin/bash
# Device run C, fourth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s4_c.sh
# Run B's CUDA tests stopped at their time limit (a cold machine: every kernel compiled
# anew) before the new tests: the sibling launches and [..., K] activations, here. Then
# the decode buckets (M = 1, 8, with the decode check) added to run B's table (shipped as
# mlx_w8a8/tables/nvidia-h200.json), and the model benchmark with that table.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s4_c}
mkdir -p "$O"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "sibling or leading_shape" \
  > "$O/cuda_tests_siblings.log" 2>&1
echo "cuda tests rc=$?"; tail -6 "$O/cuda_tests_siblings.log"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 110 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8 --pairs 10 \
  --table "$T" --no-progress > "$O/tune_decode.log" 2>&1
echo "tune decode rc=$?"; grep -A10 "decode check" "$O/tune_decode.log" | cut -c1-200
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -8 "$O/model.log"
