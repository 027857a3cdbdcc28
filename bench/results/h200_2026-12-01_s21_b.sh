#!/bin/bash
# Device run B, twenty-first set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s21_b.sh
# Ran branch fused-quantize-gemm at commit 301ebc8 (the kernel of run A); main does not carry the
# fused kernel (runs A-C measured it no faster than quantize + the TMA GEMM).
# Run A passed 28 of the fused tests and hit its time limit in the 29th (M = 2049,
# K = 14336 on the 128 x 32 tile: a hang or a slow oracle?). 1) The fused tests from there
# on, verbose, with durations. 2) Whatever they do: the host split of a chain of 40
# linears with the fused arm, and bench --cider with the fused kernel forced (tiles
# tma128 / tma128pp / tma256 at these shapes, all passed in run A).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s21_b}
mkdir -p "$O/b"
timeout 150 python3 -m pytest -v -x -p no:cacheprovider --durations=0 tests/test_cuda.py \
  -k "fused and (2049 or sibling or flight)" > "$O/b/fused_tests.log" 2>&1
echo "fused tests rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed" "$O/b/fused_tests.log" | tail -12
timeout 120 python3 bench/host_split.py --m 512,2048 --chain 40 --rounds 5 \
  > "$O/b/host_split.log" 2>&1
echo "host_split rc=$?"; tail -n 24 "$O/b/host_split.log"
timeout 110 python3 -m mlx_w8a8.bench --cider --w8a8-kernel cuda_w8a8_gemm_fused \
  --shapes 512x4096x4096 2048x4096x4096 512x14336x4096 2048x14336x4096 2048x4096x14336 \
  --jsonl "$O/b/cider.jsonl" > "$O/b/cider.log" 2>&1
echo "cider rc=$?"; tail -n 12 "$O/b/cider.log"
tar -C "$O" -czf "$O/s21_b.tgz" b && rm -rf "$O/b"
