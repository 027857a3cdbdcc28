#!/bin/bash
# Device run C, ninth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s9_c.sh
# Every CUDA test on this tree (the full suite last completed in the seventh set), four
# pytest workers where pytest-xdist is installed.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s9_c}
mkdir -p "$O"
N=""
python3 -c "import xdist" 2>/dev/null && N="-n 4"
echo "workers: ${N:-none}"
timeout 540 python3 -m pytest -q -p no:cacheprovider $N tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
