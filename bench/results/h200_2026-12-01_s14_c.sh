#!/bin/bash
# Device run C, fourteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s14_c.sh
# Run B's ncu: one warp per row issues an instruction every ~7 cycles, and the kernels
# issue about twice the instructions counted in the fast path. Now: quantize.cuh's exact
# path out of line (the kernels' code 65 -> 29 KB), quantize_stream.cu with groups of
# 1, 2 or 4 warps per row. Tests of every quantize body, then the launch shapes against
# the previous revision's block-per-row kernel (the text before this set, --base: a folder holding it) and astype(int8).
# Ran the tree of branch quantize-stream, commit f531109 (consumer groups of RW warps,
# quantize.cuh's exact path out of line). tmp_base: a folder holding quantize.cu and
# quantize.cuh of commit 3220aa3 (main's block-per-row kernel, unchanged by this set).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s14_c}
mkdir -p "$O"
timeout 200 python3 -m pytest -q -n 4 tests/test_cuda.py -k "quantize or gemv" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
MLX_USE_CUDA_GRAPHS=0 timeout 260 python3 bench/quantize_variants.py --base tmp_base \
  --m 64,512,2048,8192 --k 4096,14336 > "$O/variants.log" 2>&1
echo "variants rc=$?"; grep -vE "UserWarning|_warn_once" "$O/variants.log"
