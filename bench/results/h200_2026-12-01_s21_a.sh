#!/bin/bash
# Device run A, twenty-first set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s21_a.sh
# Ran branch fused-quantize-gemm at commit 7dd52b9 (the first version of the fused kernel); main does not carry the
# fused kernel (runs A-C measured it no faster than quantize + the TMA GEMM).
# The one-launch W8A8 linear (cuda_w8a8_gemm_fused: the quantize inside the TMA GEMM,
# shaders/cuda/fuse.cuh), first run on a GPU. 1) Its tests (bit-exact against the two
# launches, siblings, many launches in flight and again). 2) Only if they pass: the host
# split of a chain of 40 linears with the fused arm, and bench --cider with the fused
# kernel forced. Outputs packed into one archive.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s21_a}
mkdir -p "$O/a"
timeout 330 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py -k fused \
  > "$O/a/fused_tests.log" 2>&1
rc=$?; echo "fused tests rc=$rc"; tail -n 3 "$O/a/fused_tests.log"
grep -E "^(FAILED|ERROR)|Error|assert" "$O/a/fused_tests.log" | head -20
if [ $rc -eq 0 ]; then
  timeout 120 python3 bench/host_split.py --m 512,2048 --chain 40 --rounds 5 \
    > "$O/a/host_split.log" 2>&1
  echo "host_split rc=$?"; tail -n 30 "$O/a/host_split.log"
  timeout 100 python3 -m mlx_w8a8.bench --cider --w8a8-kernel cuda_w8a8_gemm_fused \
    --shapes 512x4096x4096 2048x4096x4096 512x14336x4096 2048x14336x4096 2048x4096x14336 \
    --jsonl "$O/a/cider.jsonl" > "$O/a/cider.log" 2>&1
  echo "cider rc=$?"; cat "$O/a/cider.log"
fi
tar -C "$O" -czf "$O/s21_a.tgz" a && rm -rf "$O/a"
