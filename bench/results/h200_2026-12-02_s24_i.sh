#!/bin/bash
# Device run I, twenty-fourth set: written, NOT RUN. After run H: the 32-layer model, the
# branch on its re-measured table (tmp_t/branch.json) against main's package in .main/ on
# main's shipped table, each after mlx_w8a8.warm_up (--warm-up), prefill at lengths met
# again and at new lengths, decode. Carry .main (git archive main mlx_w8a8 | tar -x -C .main).
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s24_i.sh
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s24_i}
mkdir -p "$O"
A="--model llama-3-8b --layers 32 --tokens 128,512,2048 --decode 32 --rounds 4 --new-lengths --warm-up"
timeout 280 python3 -m mlx_w8a8.bench $A --table tmp_t/branch.json --json "$O/model32_branch.jsonl" \
  > "$O/model32_branch.log" 2>&1
echo "branch rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model32_branch.log"
(cd .main && timeout 280 python3 -m mlx_w8a8.bench $A --json "$O/model32_main.jsonl") \
  > "$O/model32_main.log" 2>&1
echo "main rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model32_main.log"
