#!/bin/bash
# Device run B, second set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s2_b.sh
# Re-measures the table shipped as mlx_w8a8/tables/nvidia-h200.json with the tuner as
# it is now (cold weight copies; bound launches; the decode check): prefill buckets
# first, then the decode buckets, whose run ends with the decode check on 4 layers.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s2_b}
T="$O/nvidia-h200.json"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1
timeout 100 python3 -m pytest -q -p no:cacheprovider -n 16 tests/test_cuda.py > "$O/cuda_tests.log" 2>&1
echo "cuda tests rc=$?"; tail -1 "$O/cuda_tests.log"; grep -E "^FAILED|^ERROR" "$O/cuda_tests.log" | head -10
timeout -s INT 280 python3 -m mlx_w8a8.tune --model llama-3-8b --m 16,64,128,512,2048 --pairs 12 \
  --table "$T" --no-progress > "$O/tune_prefill.log" 2>&1
echo "tune prefill rc=$?"; tail -3 "$O/tune_prefill.log"
timeout -s INT 190 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,2,4,8 --pairs 12 \
  --table "$T" --no-progress > "$O/tune_decode.log" 2>&1
echo "tune decode rc=$?"; grep -A12 "decode check" "$O/tune_decode.log"
