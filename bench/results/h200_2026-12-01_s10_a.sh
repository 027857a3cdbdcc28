#!/bin/bash
# Device run A, tenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s10_a.sh
# The ping-pong consumers and setmaxnreg configs of the TMA GEMM (tma128pp: 128 x 128 per
# warpgroup, one producer warp; tma128pr: the same with a producer warpgroup that gives
# its registers to the consumers; tma256r: the cooperative 128 x 256 tile with them):
# every warp-specialized test on every tile, then each tile's kernel GPU time (CUPTI) and
# the wall clock of the raw int32 GEMM and the bf16-output GEMM per tile, paired.
# Ran on the tree before the configs were settled (the commit after it): its tma128pr is
# the shipped tma128pp, its tma256r the shipped tma256; its tma128pp (one producer warp,
# no setmaxnreg), tma256 (one producer warp) and tma128 (cooperative) were dropped.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s10_a}
mkdir -p "$O"
N=""
python3 -c "import xdist" 2>/dev/null && N="-n 4"
timeout 260 python3 -m pytest -q -p no:cacheprovider $N tests/test_cuda.py -k "ws or tma" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
timeout 120 python3 bench/tile_gpu_time.py --m 512,2048 --kn 4096x4096,4096x14336,14336x4096 \
  --reps 5 > "$O/tile_gpu_time.log" 2>&1
echo "tile_gpu_time rc=$?"; grep -v -i warn "$O/tile_gpu_time.log" | tail -8
A="bf16,torch"
for t in tma256 tma256r tma128 tma128pp tma128pr; do A="$A,i8gemm[$t],w8a8_mm[$t]"; done
timeout 170 python3 bench/cuda_bench.py --variants --arms "$A" --m 2048,8192 \
  --kn 4096x4096,4096x14336,14336x4096 --pairs 8 --out "$O" > "$O/bench.log" 2>&1
echo "bench rc=$?"; grep -E "^M=" "$O/bench.log" | cut -c1-400
