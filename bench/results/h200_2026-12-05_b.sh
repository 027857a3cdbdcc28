#!/bin/bash
# Device run B, 2026-12-05 (same tree as run A): python -m mlx_w8a8.check --report, with
# the time run A's 60 s limit did not give it.
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-05_b.sh
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/h200_b}
mkdir -p "$O"
timeout 400 python3 -m mlx_w8a8.check --report "$O/check.json" > "$O/check.log" 2>&1
echo "check rc=$?"; tail -n 40 "$O/check.log"
