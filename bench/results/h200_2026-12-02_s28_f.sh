#!/bin/bash
# Device run F, twenty-eighth set. Tree: branch quantize-tie-free (the tie-free
# 16-bit rows; run E timed and tested it). Every W8A8 and GEMV candidate's digest
# covers quantize.cuh, so the shipped table is stale on the branch: re-measured here as
# the twenty-seventh set's run B did (the keep-choices rule on), M = 1 and 8 with the
# decode check, then M = 2048 ... 16 (sibling and prefill checks):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s28_f.sh
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s28_f}
mkdir -p "$O" tmp_t
cp mlx_w8a8/tables/nvidia-h200.json tmp_t/branch.json
timeout -s INT 185 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 1,8 --pairs 8 \
  --check-layers 32 --table tmp_t/branch.json --no-progress > "$O/tune_m1.log" 2>&1
echo "tune m1 rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune_m1.log" | tail -8
cp tmp_t/branch.json "$O/branch_m1_nvidia-h200.json"
timeout -s INT 285 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 2048,512,128,64,16 \
  --table tmp_t/branch.json --no-progress > "$O/tune_m16.log" 2>&1
echo "tune m16 rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune_m16.log" | tail -8
cp tmp_t/branch.json "$O/branch_nvidia-h200.json"
