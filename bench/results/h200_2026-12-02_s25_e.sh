#!/bin/bash
# Device run E, twenty-fifth set (NVIDIA H200, MLX 0.32.4 CUDA build), branch
# new-length-host: re-measure M = 2048, 512, 128, 64, 16 of Llama-3-8B into
# tmp_t/branch.json (run A's copy: M = 1 and 8 re-measured), in that order, until the
# device time left runs out (SIGINT keeps what was measured; a later run without --force
# measures only what is still stale).
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s25_e.sh
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s25_e}
mkdir -p "$O"
timeout -s INT 370 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 2048,512,128,64,16 \
  --table tmp_t/branch.json --no-progress > "$O/tune_m16.log" 2>&1
echo "tune rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune_m16.log" | tail -30
cp tmp_t/branch.json "$O/branch.json"
