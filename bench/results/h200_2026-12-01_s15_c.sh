#!/bin/bash
# Device run C, fifteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s15_c.sh
# The quantize's new text (commit 636ba12) is in every W8A8 and fused-GEMV candidate's
# digest, so the shipped table is re-measured (--force), as the thirteenth set's run B
# did: M = 16, 64, 128, 512, 2048 (sibling and prefill checks), then M = 1 and 8 (decode
# check). First the every-16-bit-value quantize test (its bfloat16 input built from bits
# since run B).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s15_c}
mkdir -p "$O"
timeout 100 python3 -m pytest -q -n 4 tests/test_cuda.py -k "every_16bit" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -1 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 320 python3 -m mlx_w8a8.tune --model llama-3-8b --m 16,64,128,512,2048 --pairs 8 \
  --force --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -E "^ *(16|64|128|512|2048) " "$O/tune.log" | cut -c1-220
grep -iE -A12 "check \(|interrupted|skipped|problem\(s\) in" "$O/tune.log" | cut -c1-220 | head -40
timeout -s INT 150 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8 --pairs 8 \
  --force --table "$T" --no-progress > "$O/tune18.log" 2>&1
echo "tune 1,8 rc=$?"; grep -E "^ *(1|8) " "$O/tune18.log" | cut -c1-220
grep -iE -A9 "check \(|interrupted|problem\(s\) in" "$O/tune18.log" | cut -c1-200 | head -30
