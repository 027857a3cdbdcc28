#!/bin/bash
# Device run H, twenty-fourth set: written, NOT RUN. After run G passes, on branch
# new-length-host: re-measure the shipped table's M = 16 ... 2048 buckets for Llama-3-8B
# into a copy (the branch changed candidate code: every digest differs), then M = 1 and 8
# with the decode check on all 32 layers. The copy replaces mlx_w8a8/tables/nvidia-h200.json
# once run I shows the branch's model is no slower.
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s24_h.sh [m16|m1]
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s24_h}
mkdir -p "$O" tmp_t
[ -f tmp_t/branch.json ] || cp mlx_w8a8/tables/nvidia-h200.json tmp_t/branch.json
case "${1:-m16}" in
  m16)
    timeout -s INT 560 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 16,64,128,512,2048 \
      --table tmp_t/branch.json --no-progress > "$O/tune_m16.log" 2>&1
    echo "tune rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune_m16.log" | tail -30;;
  m1)
    timeout -s INT 200 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 1,8 --pairs 8 \
      --check-layers 32 --table tmp_t/branch.json --no-progress > "$O/tune_m1.log" 2>&1
    echo "tune rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune_m1.log" | tail -20;;
esac
cp tmp_t/branch.json "$O/branch_nvidia-h200.json"
