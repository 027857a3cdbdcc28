#!/bin/bash
# Device run C, sixteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s16_c.sh
# Ran main at commit 53287c1 (the straight-line quantize path). Its text is in every W8A8
# and fused-GEMV candidate's digest, so: every quantize and GEMV test, then the shipped
# table re-measured (--force) as the fifteenth set's run C: M = 16, 64, 128, 512, 2048
# (sibling and prefill checks), then M = 1 and 8 with the decode check on all 32 layers
# (the fifteenth set's run G found the default 4 layers kept a GEMV that 32 rejected).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s16_c}
mkdir -p "$O"
timeout 130 python3 -m pytest -q -n 4 tests/test_cuda.py -k "quantize or gemv" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 280 python3 -m mlx_w8a8.tune --model llama-3-8b --m 16,64,128,512,2048 --pairs 8 \
  --force --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -E "^ *(16|64|128|512|2048) " "$O/tune.log" | cut -c1-220
grep -iE -A12 "check \(|interrupted|skipped|problem\(s\) in" "$O/tune.log" | cut -c1-220 | head -40
timeout -s INT 170 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8 --pairs 8 --check-layers 32 \
  --force --table "$T" --no-progress > "$O/tune18.log" 2>&1
echo "tune 1,8 rc=$?"; grep -E "^ *(1|8) " "$O/tune18.log" | cut -c1-220
grep -iE -A9 "check \(|interrupted|problem\(s\) in" "$O/tune18.log" | cut -c1-200 | head -30
