#!/bin/bash
# Device run C, nineteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s19_c.sh
# Ran main at commit 0812c80.
#  1. the layer's tests on the GPU (the compile tests' comparison now allows mlx_qmm's
#     summation order, which run B measured at 5 float32 ulps);
#  2. bench --cider with 128 launches per sample (run B's step 4, with the 30 pairs the
#     bench requires) on 4096 x 4096 and 14336 x 4096 at M = 512 and 2048: how much of a
#     short chain's time per launch is the sample's fixed cost.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s19_c}
mkdir -p "$O"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_nn.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -n 2 "$O/tests.log"; grep -E "^(FAILED|ERROR|E  )" "$O/tests.log" | head -20
timeout 200 python3 -m mlx_w8a8.bench --cider --shapes 512x4096x4096 2048x4096x4096 \
  512x14336x4096 2048x14336x4096 --pairs 30 --chain 128 \
  --json "$O/cider_chain128.jsonl" > "$O/cider_chain128.log" 2>&1
echo "cider chain 128 rc=$?"; grep -v "^{" "$O/cider_chain128.log" | tail -n 7
