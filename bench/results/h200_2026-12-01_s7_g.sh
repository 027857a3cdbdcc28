#!/bin/bash
# Device run G, seventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s7_g.sh
# Run C's decode check replaced the three GEMVs (lm_head, gate/up, down_proj) by
# mx.quantized_matmul at 0.93-0.98x on a machine whose decode ran about 30% slower in
# every variant (run D: bf16 797 tok/s; runs F and I: 1162 and 1169): the M = 1 entries
# re-measured and re-checked here (run F's machine decoded at the usual speed), then the
# model on the result.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s7_g}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 200 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1 --force --pairs 8 \
  --decode-check on --sibling-check off --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A5 "check \(|interrupted" "$O/tune.log" | cut -c1-200 | head -12
timeout 200 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 512 --decode 32 \
  --rounds 8 --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -5 "$O/model.log"
