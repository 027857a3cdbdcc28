#!/bin/bash
# Device run D, thirty-second set. Trees as run C (branch tma-own-maps with its
# re-measured table; main's package in tmp_main/):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s32_d.sh
# 1) issue 9's marginal row again, `bench --cider` on 4096 x 4096 at M = 2048 and 512
#    (each table's decisions), four processes alternating main and branch;
# 2) bench/host_split.py --m 2048 (Python build, MLX encode, GPU wait per launch, fed
#    chains of 40), branch then main.
# Outcome: the four `bench --cider` processes ran; bench/host_split.py's main arm failed at
# import (tmp_main/ lacked bench/chain_timeline.py and cuda_bench.py), and its logs did not
# come back from the machine: the run's printed lines are ..._s32_d_stdout.log. Run E
# repeats the host split with both arms.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s32_d}
mkdir -p "$O"
for v in main branch main2 branch2; do
  d=.; case $v in main*) d=tmp_main;; esac
  (cd $d && timeout 45 python3 -m mlx_w8a8.bench --cider --shapes 2048x4096x4096 512x4096x4096 \
    --pairs 30 --json "$O/cider_$v.jsonl") > "$O/cider_$v.log" 2>&1
  echo "cider $v rc=$?"; tail -n 2 "$O/cider_$v.log"
done
for v in branch main; do
  d=.; [ $v = main ] && d=tmp_main
  (cd $d && timeout 100 python3 bench/host_split.py --m 2048 --chain 40 --rounds 7) > "$O/host_split_$v.log" 2>&1
  echo "host split $v rc=$?"; grep -E "^M=" "$O/host_split_$v.log"
done
