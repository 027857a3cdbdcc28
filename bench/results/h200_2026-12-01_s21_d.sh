#!/bin/bash
# Device run D, twenty-first set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s21_d.sh
# Ran main at commit 7e602d7 (the kernels and the shipped table of d65c79a; the fused
# linear of runs A-C is on branch fused-quantize-gemm only). What the twentieth set left
# unmeasured: 1) the 4-layer Llama-3-8B model bench at this tree (the layers' offer rule,
# 17f36b9, and the memo-slot fix, a91e175); 2) the layer, op and registry tests, then
# tests/test_cuda.py for the time left. Outputs in one archive.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s21_d}
mkdir -p "$O/d"
timeout 120 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 \
  --decode 32 --rounds 6 --json "$O/d/model4.jsonl" > "$O/d/model4.log" 2>&1
echo "model rc=$?"; grep -E "^(prefill|decode)|SQNR|sqnr" "$O/d/model4.log" | head -20
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_nn.py tests/test_ops.py \
  tests/test_registry.py > "$O/d/tests_layers.log" 2>&1
echo "layer tests rc=$?"; tail -n 2 "$O/d/tests_layers.log"; grep -E "^(FAILED|ERROR)" "$O/d/tests_layers.log" | head
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py > "$O/d/tests_cuda.log" 2>&1
echo "cuda tests rc=$? (124: time limit)"; tail -c 600 "$O/d/tests_cuda.log"; grep -E "^(FAILED|ERROR)" "$O/d/tests_cuda.log" | head
tar -C "$O" -czf "$O/s21_d.tgz" d && rm -rf "$O/d"
