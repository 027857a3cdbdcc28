#!/bin/bash
# Device run B, twelfth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s12_b.sh
# Narrow tiles with independent accumulator sets (WsConfig.accumulators) and the TMA A
# box of min(M, 128) rows: every narrow tile's GPU time (CUPTI, each call evaluated
# alone, graphs off) with 1, 2 and 4 sets (named <tile>a<count>; the bare name is the
# config's own count) at M = 16-512 on the Llama-3-8B projection shapes; then every CUDA
# test on the changed kernel.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s12_b}
mkdir -p "$O"
MLX_USE_CUDA_GRAPHS=0 timeout 230 python3 bench/tile_gpu_time.py --m 16,64,128,512 \
  --kn 4096x4096,4096x1024,4096x14336,14336x4096 --tiles ws32p4,ws64p4,tma32,tma64,tma128pp \
  --acc 1,2,4 --reps 5 > "$O/tiles_acc.log" 2>&1
echo "tiles rc=$?"; grep -E "^(M=|MLX)" "$O/tiles_acc.log"; grep -iE "error|Traceback" "$O/tiles_acc.log" | head -5
timeout 330 python3 -m pytest -q -n 4 tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -5 "$O/tests.log"; grep -E "^FAILED|^ERROR" "$O/tests.log" | head -20
