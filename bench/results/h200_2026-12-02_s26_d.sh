#!/bin/bash
# Device run D, twenty-sixth set: run B's 32-layer model pair in the other order (the
# branch bound-objects on its re-measured table first, then main), same tree and .main/:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s26_d.sh
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s26_d}
mkdir -p "$O"
A="--model llama-3-8b --layers 32 --tokens 128,512,2048 --decode 32 --rounds 4 --new-lengths --warm-up"
timeout 100 python3 -m mlx_w8a8.bench $A --table tmp_t/branch.json \
  --json "$O/model32_branch.jsonl" > "$O/model32_branch.log" 2>&1
echo "branch rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model32_branch.log"
(cd .main && timeout 100 python3 -m mlx_w8a8.bench $A --json "$O/model32_main.jsonl") \
  > "$O/model32_main.log" 2>&1
echo "main rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model32_main.log"
