#!/bin/bash
# Device run E, eighteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s18_e.sh
# Ran main at commit dbcf2a3 plus bench/qmm_probe.py and bench/compile_probe.py (committed
# after). Run D showed MLX's own mx.quantized_matmul (8-bit, group 64) returning zeros,
# stale data or non-finite values for the small layers of tests/test_nn.py's compile
# tests (N = 64 / 32, K = 128 / 64), stock nn.QuantizedLinear alike, eager and compiled.
# This maps where it is wrong: M, N, K, group size 64 and 32, bfloat16 and float32.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s18_e}
mkdir -p "$O"
timeout 200 python3 bench/qmm_probe.py --m 1,4,16,32,256 --n 32,64,256,1024,4096 \
  --k 64,128,256,512,1024,2048,4096 > "$O/qmm_probe.log" 2>&1
echo "probe rc=$?"; tail -n 60 "$O/qmm_probe.log"
timeout 100 python3 bench/qmm_probe.py --m 1,4,32 --n 64,1024 --k 64,128,256,4096 \
  --group-size 32 > "$O/qmm_probe_g32.log" 2>&1
echo "probe g32 rc=$?"; tail -n 20 "$O/qmm_probe_g32.log"
# (The first probe ran out of its 200 s after the bfloat16 K = 64 cases; the second call
# of this run, below alone, covered K = 64-256 in both dtypes.)
timeout 140 python3 bench/qmm_probe.py --m 1,4,32 --n 64,1024 --k 64,128,192,256 \
  > "$O/qmm_probe_small_k.log" 2>&1
echo "probe small K rc=$?"; tail -n 40 "$O/qmm_probe_small_k.log"
