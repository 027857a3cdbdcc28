#!/bin/bash
# Device run F, twenty-ninth set. As run E's `bench --cider` (branch quantize-one-output
# at 9ec0a62 against main's package in tmp_main/, the TMA W8A8 linear forced), in the
# other process order (branch first) and at M = 2048 / 512 / 128 on 4096 x 4096 only:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s29_f.sh
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s29_f}
mkdir -p "$O"
CS="2048x4096x4096 512x4096x4096 128x4096x4096"
for v in branch main; do
  d=.; [ $v = main ] && d=tmp_main
  (cd $d && timeout 80 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
    --w8a8-kernel cuda_w8a8_gemm_tma --json "$O/cider_$v.jsonl") > "$O/cider_$v.log" 2>&1
  echo "cider $v rc=$?"; tail -n 4 "$O/cider_$v.log"
done
