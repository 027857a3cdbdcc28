#!/bin/bash
# Device run E, twenty-seventh set. Main after the merge of tma-rows-on-device (its
# re-measured table shipped):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s27_e.sh
# 1) the 4-layer model as shipped now (run C ran main before the merge),
#    --new-lengths --warm-up, 6 rounds;
# 2) cProfile of the 32-layer build at 20 new lengths (where the remaining host time of
#    a new prompt length goes, on the shipped tree).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s27_e}
mkdir -p "$O"
A="--model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 --rounds 6 --new-lengths --warm-up"
timeout 100 python3 -m mlx_w8a8.bench $A --json "$O/model4.jsonl" > "$O/model4.log" 2>&1
echo "model4 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model4.log"
timeout 90 python3 bench/new_length_build.py --layers 32 --t 129 --count 20 --profile > "$O/build32_profile.log" 2>&1
echo "profile rc=$?"; head -60 "$O/build32_profile.log"
