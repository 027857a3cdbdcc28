#!/bin/bash
# Device run B, twenty-ninth set. Tree: main at 05d17a6 (the tie-free quantize merged, its
# table shipped), as run A:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s29_b.sh [cider|model]
# cider: `python -m mlx_w8a8.bench --cider` at M = 512, 2048, 8192 on 4096 x 4096 and the
#        Llama-3-8B / Qwen-7B MLP shapes (as the twenty-eighth set's run B, now with the
#        tie-free quantize), then the 4096 x 4096 point at M = 2048 again with chains of
#        32 launches (the bench's cap) instead of the adaptive 12: run A put about 20-24 us
#        per launch of a once-per-eval cost into a chain of 12, which both arms pay;
# model: the 4-layer model with --new-lengths (not run on the shipped package yet), then
#        the 32-layer model with --new-lengths, both after mlx_w8a8.warm_up.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s29_b}
mkdir -p "$O"
case "${1:-cider}" in
  cider)
    CS=""
    for m in 512 2048 8192; do
      for nk in 4096x4096 14336x4096 4096x14336 18944x3584 3584x18944; do CS="$CS ${m}x$nk"; done
    done
    timeout 250 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
      --json "$O/cider.jsonl" > "$O/cider.log" 2>&1
    echo "cider rc=$?"; tail -n 17 "$O/cider.log"
    timeout 60 python3 -m mlx_w8a8.bench --cider --shapes 2048x4096x4096 --pairs 30 --chain 32 \
      --json "$O/cider_chain32.jsonl" > "$O/cider_chain32.log" 2>&1
    echo "cider chain 32 rc=$?"; tail -n 3 "$O/cider_chain32.log";;
  model)
    timeout 200 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
      --rounds 6 --new-lengths --warm-up --json "$O/model4.jsonl" > "$O/model4.log" 2>&1
    echo "model4 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model4.log"
    timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 128,512,2048 --decode 32 \
      --rounds 4 --new-lengths --warm-up --json "$O/model32.jsonl" > "$O/model32.log" 2>&1
    echo "model32 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model32.log";;
esac
