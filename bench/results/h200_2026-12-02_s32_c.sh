#!/bin/bash
# Device run C, thirty-second set. Tree: branch tma-own-maps with run B's re-measured
# table in mlx_w8a8/tables/nvidia-h200.json (the package as it would merge), main's
# package in tmp_main/ as in run A:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s32_c.sh
# 1) `bench --cider` on each table's own decisions, branch then main: M = 2048 (4096 x
#    4096 and two MLP shapes) and M = 512 on 4096 x 4096;
# 2) the 4-layer Llama-3-8B-shaped model with --new-lengths after mlx_w8a8.warm_up;
# 3) the 32-layer model, the same.
# Outcome: `bench --cider` 1.42x (branch) against 1.32x (main) on 4096 x 4096 at M = 2048;
# the 4-layer and 32-layer rows are in docs/cuda.md's figures table.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s32_c}
mkdir -p "$O"
CS="2048x4096x4096 2048x14336x4096 2048x4096x14336 512x4096x4096"
for v in branch main; do
  d=.; [ $v = main ] && d=tmp_main
  (cd $d && timeout 60 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
    --json "$O/cider_$v.jsonl") > "$O/cider_$v.log" 2>&1
  echo "cider $v rc=$?"; tail -n 5 "$O/cider_$v.log"
done
timeout 200 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 6 --new-lengths --warm-up --json "$O/model4.jsonl" > "$O/model4.log" 2>&1
echo "model4 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model4.log"
timeout 190 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --new-lengths --warm-up --json "$O/model32.jsonl" > "$O/model32.log" 2>&1
echo "model32 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model32.log"
