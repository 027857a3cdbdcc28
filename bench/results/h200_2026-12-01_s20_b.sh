#!/bin/bash
# Device run B, twentieth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s20_b.sh
# Ran main at commit 8b3caf4 plus bench/host_split.py with its w8a8c arm (committed after
# this run). Run A: a W8A8 linear's Python build is 8-10 us per launch pair against bf16's
# 1.1 (each mx.fast.cuda_kernel call 3.4-4.3 us). Does mx.compile around the pair (a call
# replays the traced primitives) cut it? Same split, MLX's defaults and a graph per 10 nodes.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s20_b}
mkdir -p "$O"
run() { name=$1; shift; timeout 200 env "$@" python3 bench/host_split.py --m 128,512,2048 > "$O/$name.log" 2>&1; echo "$name rc=$?"; }
run default
run ops10 MLX_MAX_OPS_PER_BUFFER=10
for f in default ops10; do echo "== $f"; grep -E "^M=" "$O/$f.log"; done
