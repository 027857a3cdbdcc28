#!/bin/bash
# Device run C, eighteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s18_c.sh
# Ran main at commit 0c614e8 plus the built-in prior's new CUDA rules for int8_matmul and
# quantize_activation (from run B's table; committed after this run).
#  1. tune --op int8_matmul at M = 512 and 8192 (run B measured 1, 16, 128, 2048): the
#     rules' middle and upper ranges;
#  2. bench --cider, its own shape list (M = 16-2048 on 4096 x 4096, the Qwen MLP
#     shapes at 128 and 512) and M = 8192 on the five shapes of run A, with no table for
#     the raw ops: the W8A8 arm as the op runs unforced, the raw arm the prior's pick;
#  3. the ops' tests and the layer's on the GPU (oracle comparisons through the bound
#     launches the ops now keep, the kernels the shipped table and the prior pick).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s18_c}
mkdir -p "$O"
timeout 150 python3 -m mlx_w8a8.tune --op int8_matmul --shapes mlp attn --m 512,8192 \
  --pairs 10 --table "$O/raw.json" > "$O/tune_int8.log" 2>&1
echo "tune int8 rc=$?"; grep -vE "^tune: " "$O/tune_int8.log" | tail -n 20
timeout 200 python3 -m mlx_w8a8.bench --cider --pairs 30 --json "$O/cider.jsonl" > "$O/cider.log" 2>&1
echo "cider rc=$?"; grep -v "^{" "$O/cider.log" | tail -n 15
CS=""
for nk in 4096x4096 14336x4096 4096x14336 18944x3584 3584x18944; do CS="$CS 8192x$nk"; done
timeout 120 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
  --json "$O/cider8192.jsonl" > "$O/cider8192.log" 2>&1
echo "cider8192 rc=$?"; grep -v "^{" "$O/cider8192.log" | tail -n 8
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_ops.py tests/test_nn.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -n 3 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head
