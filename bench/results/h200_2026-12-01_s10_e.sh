#!/bin/bash
# Device run E, tenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s10_e.sh
# The 4 tests run D failed on a test defect (the 128-wide TMA tile is now named
# tma128pp), fixed: the TMA producer against the cp.async one, bit for bit.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s10_e}
mkdir -p "$O"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "tma_producer_matches" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
