#!/bin/bash
# Device run F, thirty-second set. Trees as run C: the 32-layer model, main's package
# (tmp_main/, its shipped table) then the branch's (its re-measured table), one process
# each, to see whether run C's rows at new lengths (0.82x / 0.76x / 1.06x bf16, below the
# twenty-ninth set's main) move with the branch or between processes:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s32_f.sh
# Outcome: both processes ran (rows in docs/cuda.md's figures table).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s32_f}
mkdir -p "$O"
for v in main branch; do
  d=.; [ $v = main ] && d=tmp_main
  (cd $d && timeout 185 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 \
    --tokens 128,512,2048 --decode 32 --rounds 4 --new-lengths --warm-up \
    --json "$O/model32_$v.jsonl") > "$O/model32_$v.log" 2>&1
  echo "model32 $v rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model32_$v.log"
done
