#!/bin/bash
# Device run C, twenty-first set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s21_c.sh
# Ran branch fused-quantize-gemm at commit e486adf (the fused kernel with the next row asked for early); main does not carry the
# fused kernel (runs A-C measured it no faster than quantize + the TMA GEMM).
# Runs A and B: the fused tests that finished passed; the one at M = 2049, K = 14336 ran
# past the time limit in its int64 numpy oracle (N = 1024), now N = 40. The fused kernel
# now asks for its next row as it starts one and publishes a row with red.release.
# 1) Every fused test. 2) Host split at M = 16, 128, 512 (fused arm). 3) Paired dependent
# chains, TMA two launches against the fused launch, on Llama-3-8B shapes at M = 16-2048.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s21_c}
mkdir -p "$O/c"
timeout 200 python3 -m pytest -v -x -p no:cacheprovider --durations=8 tests/test_cuda.py \
  -k fused > "$O/c/fused_tests.log" 2>&1
rc=$?; echo "fused tests rc=$rc"; grep -E "FAILED|ERROR|passed|failed" "$O/c/fused_tests.log" | tail -8
if [ $rc -ne 0 ]; then tar -C "$O" -czf "$O/s21_c.tgz" c && rm -rf "$O/c"; exit 0; fi
timeout 100 python3 bench/host_split.py --m 16,128,512 --chain 40 --rounds 5 \
  > "$O/c/host_split.log" 2>&1
echo "host_split rc=$?"; grep -E "w8a8 |fused|bf16 |DIFFERS" "$O/c/host_split.log"
timeout 200 python3 -m mlx_w8a8.bench --baseline cuda_w8a8_gemm_tma --candidate cuda_w8a8_gemm_fused \
  --cases 16x4096x4096 16x6144x4096 128x4096x4096 128x6144x4096 128x28672x4096 128x4096x14336 \
  512x4096x4096 512x28672x4096 2048x4096x4096 2048x4096x14336 \
  --jsonl "$O/c/qualify.jsonl" > "$O/c/qualify.log" 2>&1
echo "qualify rc=$?"; tail -n 16 "$O/c/qualify.log"
tar -C "$O" -czf "$O/s21_c.tgz" c && rm -rf "$O/c"
