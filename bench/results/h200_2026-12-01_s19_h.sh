#!/bin/bash
# Device run H, nineteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s19_h.sh
# Ran main at commit 3e083a0. Run G: in fed chains of 40 launches the wall clock exceeds
# the GPU span by 26-36 us per launch in every arm. Is it MLX's CUDA graphs? The same
# chains (4096 x 4096, M = 512 and 2048) with MLX's defaults, with a graph committed
# every 100 nodes instead of 20 (MLX_MAX_OPS_PER_BUFFER=100), and with graphs off.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s19_h}
mkdir -p "$O"
run() {
  timeout 90 env "$@" python3 bench/chain_timeline.py --linear --m 512,2048 --kn 4096x4096 \
    --chain 40 --rounds 5
}
run > "$O/default.log" 2>&1; echo "default rc=$?"
run MLX_MAX_OPS_PER_BUFFER=100 > "$O/ops100.log" 2>&1; echo "ops100 rc=$?"
run MLX_USE_CUDA_GRAPHS=0 > "$O/nographs.log" 2>&1; echo "nographs rc=$?"
for f in default ops100 nographs; do echo "== $f"; grep -E "feed" "$O/$f.log"; done
