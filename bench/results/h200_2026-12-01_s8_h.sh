#!/bin/bash
# Device run H, eighth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s8_h.sh
# The registered candidates with their new tile choice (tiles_filling) against the
# oracle: per-channel linears, bound launches on [..., K], sibling launches in a block.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s8_h}
mkdir -p "$O"
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
  -k "per_channel or gemm_ws_candidate or bound_launches or linear_siblings or stages_equal" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$O/tests.log"
