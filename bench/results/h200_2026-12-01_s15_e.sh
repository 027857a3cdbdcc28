#!/bin/bash
# Device run E, fifteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s15_e.sh
# Run D: test_w8a8_gemm_unsigned_k_bound failed at K = 66304 and 66336 (8 tests): the
# quantize block for those K had 1024 threads, and at 71 registers per thread (the new
# quantize) it needs more than the SM's 64 K registers, so it never launched. The launcher
# now caps quantize blocks at 512 threads (cuda_launch.QUANT_MAX_THREADS;
# tests/test_cuda_compile.py checks registers x threads). Those tests again, and every
# quantize test with the new (8, 66304) shape.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s15_e}
mkdir -p "$O"
timeout 300 python3 -m pytest -q -n 4 tests/test_cuda.py -k "unsigned_k_bound or quantize or gemv" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
