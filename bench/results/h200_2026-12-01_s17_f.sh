#!/bin/bash
# Device run F, seventeenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s17_f.sh
# Ran main at commit e55a26f. tmp_t/candidate.json is run E's table (M = 16-2048
# re-measured, the sibling and prefill checks on all 32 blocks: sibling groups kept at
# every T). The model benchmark on all 32 Llama-3-8B layers, once with the shipped table
# and once with the candidate (each paired with bf16 and mlx-lm 8-bit in its own run),
# prefill only (the M = 1 entries are the same in both).
# (tmp_t/ was an untracked copy, deleted after the set; its file is ..._s17_e_nvidia-h200.json,
# shipped since as mlx_w8a8/tables/nvidia-h200.json.)
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s17_f}
mkdir -p "$O"
for tab in shipped candidate; do
  arg=""; [ $tab = candidate ] && arg="--table tmp_t/candidate.json"
  timeout 280 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 16,128,512,2048 \
    --decode 0 --rounds 5 $arg --json "$O/model32_$tab.jsonl" > "$O/model32_$tab.log" 2>&1
  echo "model $tab rc=$?"; tail -n 7 "$O/model32_$tab.log"
done
