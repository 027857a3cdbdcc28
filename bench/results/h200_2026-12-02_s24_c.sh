#!/bin/bash
# Device run C, twenty-fourth set (2026-12-02; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s24_c.sh
# Ran in tmp_run/, an untracked copy of branch quantize-staged's tree (9002b10: main 40e40c8
# with the staged quantize; tmp_run holds the package, tests and bench): the rowsum
# body stages its row in dynamic shared memory (quantize.cu quantize_row_staged, 47
# registers against 80), rowsum_regs keeps the register body for rows over 48000 bytes;
# tmp_base/main holds main's quantize.cu / quantize.cuh / shape.cuh. 1) the quantize
# tests of tests/test_cuda.py (both bodies, every shape); 2) bench/quantize_variants.py:
# the staged launch against main's text in one process (CUPTI kernel times, CUDA graphs
# off, outputs compared bit for bit first), with 128 / 256-thread arms.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s24_c}
mkdir -p "$O/c"
cd tmp_run
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda.py -k "quantize" \
  > "$O/c/tests.log" 2>&1
echo "tests rc=$?"; tail -n 2 "$O/c/tests.log"; grep -E "^(FAILED|ERROR)" "$O/c/tests.log" | head -20
MLX_USE_CUDA_GRAPHS=0 timeout 200 python3 bench/quantize_variants.py --base tmp_base/main \
  --m 64,512,2048,8192 --k 4096,14336 > "$O/c/variants.log" 2>&1
echo "variants rc=$?"; grep -vE "UserWarning|_warn_once" "$O/c/variants.log"
tar -C "$O" -czf "$O/s24_c.tgz" c && rm -rf "$O/c"
