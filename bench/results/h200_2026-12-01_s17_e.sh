#!/bin/bash
# Device run E, seventeenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s17_e.sh
# Ran main at commit e55a26f. Run D's checks on all 32 blocks kept the sibling group
# launches at T = 16 and 512, which the shipped table's checks (4 blocks, sixteenth set)
# had turned off. So: the shipped table re-measured at M = 16-2048 (--force; its M = 1
# and 8 entries, checked on 32 blocks in the sixteenth set, kept as they are) with the
# sibling and prefill checks at the default depth (auto: 32 blocks) and the second look
# at unsettled verdicts. The candidate table is tune.json; run F compares it with the
# shipped one in the model.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s17_e}
mkdir -p "$O"
cp mlx_w8a8/tables/nvidia-h200.json "$O/tune.json"
timeout 580 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 16,64,128,512,2048 \
  --table "$O/tune.json" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune.log" | tail -45
