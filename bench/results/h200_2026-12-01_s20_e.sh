#!/bin/bash
# Device run E, twentieth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s20_e.sh
# Ran main at commit fab117e with run D's table as mlx_w8a8/tables/nvidia-h200.json, and
# the package of commit 8b3caf4 (the nineteenth set's tree and its shipped table) in .base/.
# 1) M = 1 and 8 re-measured into that table as the sixteenth set's run C did (8 pairs,
# the decode check on all 32 layers). 2) bench/host_split.py on the fused linear. 3) The
# cider bench on 4096 x 4096 and two MLP shapes at M = 512 and 2048. 4) The 4-layer model
# benchmark, this tree and the old one in alternating processes (new, old, new, old): each
# tree's table is stale under the other's code, so they cannot share a process.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s20_e}
mkdir -p "$O"
timeout -s INT 150 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 1,8 --pairs 8 \
  --check-layers 32 --table mlx_w8a8/tables/nvidia-h200.json --no-progress > "$O/tune18.log" 2>&1
echo "tune rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune18.log" | tail -12
cp mlx_w8a8/tables/nvidia-h200.json "$O/nvidia-h200.json"
timeout 60 python3 bench/host_split.py --m 512,2048 > "$O/host_split.log" 2>&1
echo "host_split rc=$?"; grep -E "^M=" "$O/host_split.log" | grep -E "bf16|w8a8"
CS=""
for m in 512 2048; do
  for nk in 4096x4096 14336x4096 4096x14336; do CS="$CS ${m}x$nk"; done
done
timeout 150 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
  --json "$O/cider.jsonl" > "$O/cider.log" 2>&1
echo "cider rc=$?"; grep -v "^{" "$O/cider.log" | tail -n 9
model() {
  (cd "$1" && timeout 110 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 \
    --tokens 128,512,2048 --decode 32 --rounds 6 --json "$O/model4_$2.jsonl") > "$O/model4_$2.log" 2>&1
  echo "model $2 rc=$?"; grep -E "^(prefill|decode)" "$O/model4_$2.log"
}
model . new1
model .base old1
model . new2
model .base old2
