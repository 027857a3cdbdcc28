#!/bin/bash
# Device run F, fourteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s14_f.sh
# The fused RMSNorm + quantize (norm.cu, mlx_w8a8.norms; branch fused-norm, commit
# 401d52a). Every CUDA test (the new rms_quantize and fused-model tests among them),
# then the model benchmark, 4 Llama-3-8B layers, with the unfused arm (--unfused: the
# same model with its norms run as nn.RMSNorm), on the shipped table.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s14_f}
mkdir -p "$O"
timeout 290 python3 -m pytest -q -n 4 tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
timeout 250 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 16,32,128,512,2048 --decode 32 \
  --rounds 6 --unfused --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model rc=$?"; tail -12 "$O/model.log"
