#!/bin/bash
# Device run I, seventeenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s17_i.sh
# Ran main at commit a010c4c's successors (the shipped table of run E; no code on this
# path changed since). The M = 1 entries re-measured into a copy of the shipped table
# with the decode check on all 32 layers (auto) and its second look at unsettled
# verdicts (the sixteenth set's check, without it, replaced gate+up's GEMV at 1.03x,
# p25 0.98x). Where the check keeps a GEMV, the 32-layer decode on that table against
# mlx-lm 8-bit (whose kernel every M = 1 layer runs in the shipped table).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s17_i}
mkdir -p "$O"
cp mlx_w8a8/tables/nvidia-h200.json "$O/t.json"
timeout -s INT 240 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1 --pairs 8 --force \
  --table "$O/t.json" --no-progress > "$O/tune1.log" 2>&1
echo "tune rc=$?"; grep -A8 "decode check (" "$O/tune1.log" | cut -c1-200
if grep -A8 "decode check (" "$O/tune1.log" | grep -q -- "-> kept"; then
  timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 1 --decode 32 \
    --rounds 6 --table "$O/t.json" --json "$O/decode32.jsonl" > "$O/decode32.log" 2>&1
  echo "decode32 rc=$?"; tail -n 4 "$O/decode32.log" | head -2
fi
