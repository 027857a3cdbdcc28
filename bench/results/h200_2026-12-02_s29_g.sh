#!/bin/bash
# Device run G, twenty-ninth set. Tree: main at 263c4eb (the package as in runs A-C: the
# tie-free quantize and its table; docs and bench scripts changed since): a second process
# of run B's 32-layer model, to see whether its new-length row at T = 513.. (0.85x bf16,
# one process) holds:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s29_g.sh
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s29_g}
mkdir -p "$O"
timeout 170 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --new-lengths --warm-up --json "$O/model32.jsonl" > "$O/model32.log" 2>&1
echo "model32 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model32.log"
