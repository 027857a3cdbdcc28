#!/bin/bash
# Device run F, eighth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s8_f.sh
# The new TMA tiles (64 and 32 columns) through every warp-specialized test; the shipped
# table re-tuned with both checks (the ws / TMA digests changed with tiles_filling); the
# 4-layer model on it. Run E (all CUDA tests) ran out of its 240 s at 41% with no failure.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s8_f}
mkdir -p "$O"
timeout 110 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py -k "tma64 or tma32" > "$O/tests.log" 2>&1
rc=$?
echo "tests rc=$rc"; tail -2 "$O/tests.log"
[ $rc -eq 0 ] || { grep -E "^(FAILED|E )" "$O/tests.log" | head -20; exit 3; }
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 290 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8,128,512,2048 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A9 "check \(|interrupted" "$O/tune.log" | cut -c1-200 | head -30
timeout 175 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 5 --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -9 "$O/model.log"
