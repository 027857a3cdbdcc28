#!/bin/bash
# Device run F, sixteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s16_f.sh
# Ran the branch quantize-fit (the straight-line quantize as its own instantiation,
# template FIT: 68 registers against main's 80). tmp_v/main holds main's quantize.cu /
# quantize.cuh (launched by the branch's launcher, whose FIT template argument main's
# text ignores). The quantize exactness tests on the branch, then kernel time against
# main's text, graphs off.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s16_f}
mkdir -p "$O"
timeout 110 python3 -m pytest -q -n 4 tests/test_cuda.py \
  -k "quantize_bit_exact or row_sum_bit_exact or every_16bit or boundaries" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head
MLX_USE_CUDA_GRAPHS=0 timeout 100 python3 bench/quantize_variants.py --base tmp_v/main \
  --no-shapes --m 512,2048,8192 --k 4096,14336 --rounds 7 > "$O/variants.log" 2>&1
echo "variants rc=$?"; grep -vE "UserWarning|_warn_once" "$O/variants.log"
