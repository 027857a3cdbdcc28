#!/bin/bash
# Device run C, seventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s7_c.sh
# Kernel headers reach MLX as one #include line (cuda_launch.header_include) and TMA
# sibling launches no longer hand the tensor-map scratch to the sibling memo: every CUDA
# test on the new launch path, then the shipped table re-tuned with its checks (both
# changes are in functions every CUDA linear's digest covers).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s7_c}
mkdir -p "$O"
timeout 200 python3 -m pytest -q -rs -n 8 -p no:cacheprovider tests/test_cuda.py > "$O/tests.log" 2>&1
rc=$?
echo "tests rc=$rc"; tail -2 "$O/tests.log"
[ $rc -eq 0 ] || exit 3
ls "${MLX_W8A8_CACHE_DIR:-$HOME/.cache/mlx_w8a8}/cuda" | head
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 330 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8,128,512,2048 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A9 "check \(|interrupted" "$O/tune.log" | cut -c1-200 | head -24
