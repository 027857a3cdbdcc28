#!/bin/bash
# Device run A, twenty-third set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build): the script
# bench/results/h200_2026-12-01_s22_f.sh of branch fused-quantize-gemm-2, written in the
# twenty-second set and run unchanged here at the branch's commit affb8dd (rebased onto main
# 4a48829). Project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s22_f.sh
# Logs: h200_2026-12-01_s23_a_{fused_tests,host_split,qualify}.log, ..._qualify.jsonl.
# Runs branch fused-quantize-gemm-2 (main's tree plus the fused linear): the fused linear's second form (each consumer
# warp quantizes one row, the producer warpgroup's three idle warps the rest beside the
# MMAs; setmaxnreg 64 / 216), never run on a GPU before. Run C's steps on it:
# 1) every fused test (8 workers); 2) host split at M = 16, 512, 2048 (fused arm against
# the two-launch w8a8 arm); 3) paired dependent chains, the TMA two launches against the
# fused launch, on Llama-3-8B shapes at M = 16-2048.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s22_f}
mkdir -p "$O/f"
timeout 200 python3 -m pytest -v -n 8 -p no:cacheprovider --durations=8 tests/test_cuda.py \
  -k fused > "$O/f/fused_tests.log" 2>&1
rc=$?; echo "fused tests rc=$rc"; grep -E "FAILED|ERROR|passed|failed" "$O/f/fused_tests.log" | tail -8
if [ $rc -ne 0 ]; then tar -C "$O" -czf "$O/s22_f.tgz" f && rm -rf "$O/f"; exit 0; fi
timeout 120 python3 bench/host_split.py --m 16,512,2048 --chain 40 --rounds 5 \
  > "$O/f/host_split.log" 2>&1
echo "host_split rc=$?"; grep -E "w8a8 |fused|bf16 |DIFFERS" "$O/f/host_split.log"
timeout 200 python3 -m mlx_w8a8.bench --baseline cuda_w8a8_gemm_tma --candidate cuda_w8a8_gemm_fused \
  --cases 16x4096x4096 16x6144x4096 128x4096x4096 128x6144x4096 128x28672x4096 128x4096x14336 \
  512x4096x4096 512x28672x4096 2048x4096x4096 2048x4096x14336 \
  --jsonl "$O/f/qualify.jsonl" > "$O/f/qualify.log" 2>&1
echo "qualify rc=$?"; tail -n 16 "$O/f/qualify.log"
tar -C "$O" -czf "$O/s22_f.tgz" f && rm -rf "$O/f"
