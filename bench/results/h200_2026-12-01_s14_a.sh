#!/bin/bash
# Device run A, fourteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s14_a.sh
# The bulk-copy-fed quantize (quantize_stream.cu): its exactness tests and every other
# quantize test, then its launch shapes against quantize.cu's block per row,
# astype(int8) and the copy floor, kernel time without CUDA graphs.
# Ran the tree of branch quantize-stream before its commit: quantize_stream.cu with one
# consumer warp per row (stages not yet a multiple of the consumers). Not on main.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s14_a}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout 200 python3 -m pytest -q -n 4 tests/test_cuda.py -k "quantize" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -5 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
MLX_USE_CUDA_GRAPHS=0 timeout 240 python3 bench/quantize_variants.py --m 64,256,512,1024,2048,8192 \
  --k 4096,14336 > "$O/variants.log" 2>&1
echo "variants rc=$?"; grep -vE "UserWarning|_warn_once" "$O/variants.log"
