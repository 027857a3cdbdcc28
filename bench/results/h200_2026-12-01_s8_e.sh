#!/bin/bash
# Device run E, eighth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s8_e.sh
# Tiles that fill the SMs (tiles_filling) and the TMA producer at 64 and 32 columns: the
# CUDA tests; the GPU time of every tile at small M (CUPTI).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s8_e}
mkdir -p "$O"
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py > "$O/tests.log" 2>&1
rc=$?
echo "tests rc=$rc"; tail -3 "$O/tests.log"
[ $rc -eq 0 ] || { grep -E "^(FAILED|E )" "$O/tests.log" | head -20; exit 3; }
timeout 200 python3 bench/tile_gpu_time.py --m 16,128,512 --kn 4096x4096,4096x1024,4096x14336,14336x4096 \
  --reps 5 > "$O/tile_gpu_time.log" 2>&1
echo "tile rc=$?"; grep "^M=" "$O/tile_gpu_time.log" | cut -c1-330
