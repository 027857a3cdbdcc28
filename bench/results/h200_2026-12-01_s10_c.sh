#!/bin/bash
# Device run C, tenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s10_c.sh
# The shipped table's M = 1 and 8 entries re-tuned on run B's table (the gemm_ws.cu
# digests changed) with the decode check; then the model on the resulting table, 4 and
# 32 Llama-3-8B layers, against bf16 and mlx-lm 8-bit.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s10_c}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 230 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A9 "check \(|interrupted|problem\(s\) in" "$O/tune.log" | cut -c1-200 | head -30
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 6 --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -8 "$O/model.log"
timeout 130 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --table "$T" --json "$O/model32.jsonl" > "$O/model32.log" 2>&1
echo "32-layer model bench rc=$?"; tail -8 "$O/model32.log"
