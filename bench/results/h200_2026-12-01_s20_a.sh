#!/bin/bash
# Device run A, twentieth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s20_a.sh
# Ran main at commit 8b3caf4 plus bench/host_split.py (committed after this run, with the
# w8a8c arm and its output check added for run B), with the
# py-spy 0.4.3 binary beside the carried MLX build.
# Where the host time of a chain of linears goes (4096 x 4096, M = 512 and 2048, fed
# chains of 40): Python build, MLX encode (mx.async_eval) and GPU wait per launch, with
# MLX's defaults (a CUDA graph per 100 nodes on sm_90), a graph per 10 nodes, and graphs
# off; a chain of 200 with the defaults; then a native sampling profile of 6 s of W8A8 and
# bf16 chains at M = 512.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s20_a}
mkdir -p "$O"
SPY=$(dirname "$(python3 -c 'import mlx_lm, os; print(os.path.dirname(mlx_lm.__file__))')")/py-spy
run() { name=$1; shift; timeout 150 env "$@" python3 bench/host_split.py --m 512,2048 > "$O/$name.log" 2>&1; echo "$name rc=$?"; }
run default
run ops10 MLX_MAX_OPS_PER_BUFFER=10
run nographs MLX_USE_CUDA_GRAPHS=0
timeout 150 python3 bench/host_split.py --m 512,2048 --chain 200 --rounds 5 > "$O/chain200.log" 2>&1; echo "chain200 rc=$?"
for arm in w8a8 bf16; do
  timeout 90 "$SPY" record --native -r 250 -f raw -o "$O/spy_$arm.txt" -- \
    python3 bench/host_split.py --m 512 --loop $arm --seconds 6 > "$O/spy_$arm.log" 2>&1
  echo "spy $arm rc=$?"
done
for f in default ops10 nographs chain200; do echo "== $f"; grep -E "^M=" "$O/$f.log"; done
