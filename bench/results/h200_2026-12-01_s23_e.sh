#!/bin/bash
# Device run E, twenty-third set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s23_e.sh
# Ran main at commit 82b5517 (the tuner prunes on its first timed round, not on one
# launch) with tmp_t/m2048.json, an untracked copy of the shipped table. 1) The M = 2048
# bucket of Llama-3-8B re-measured into it by the fixed tuner (--force; the checks as
# shipped); 2) the 4-layer model, that table against the shipped one in alternating
# processes (new, shipped, new, shipped).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s23_e}
mkdir -p "$O/e"
timeout -s INT 220 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 2048 \
  --table tmp_t/m2048.json --no-progress > "$O/e/tune2048.log" 2>&1
echo "tune rc=$?"; grep -vE "^--" "$O/e/tune2048.log" | tail -14
cp tmp_t/m2048.json "$O/e/m2048.json"
for r in new shipped new shipped; do
  arg=""; [ $r = new ] && arg="--table tmp_t/m2048.json"
  timeout 70 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 512,2048 --decode 0 \
    --rounds 6 $arg --json "$O/e/model4_$r.jsonl" >> "$O/e/model4_$r.log" 2>&1
  echo "model $r rc=$?"; grep -E "^prefill" "$O/e/model4_$r.log" | tail -2
done
tar -C "$O" -czf "$O/s23_e.tgz" e && rm -rf "$O/e"
