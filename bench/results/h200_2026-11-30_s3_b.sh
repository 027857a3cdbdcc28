#!/bin/bash
# Device run B, third set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s3_b.sh
# Run A found every ws kernel 1.3-1.4x slower than before: a branch around the consumers'
# wgmma made ptxas serialize them (C7520). With the branch gone:
# 1. the ws tests  2. every ws tile vs bf16 / mlx-lm 8-bit / cuBLASLt at M = 128..2048
# 3. ncu of the ws GEMM  4. the shipped table re-measured (prefill buckets, then M = 1, 8
# with the decode check), as in run F of the second set.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s3_b}
mkdir -p "$O"
timeout 100 python3 -m pytest -q -rs -p no:cacheprovider -n 16 tests/test_cuda.py -k "ws or k_bound" > "$O/cuda_tests_ws.log" 2>&1
echo "ws tests rc=$?"; tail -1 "$O/cuda_tests_ws.log"; grep -E "^FAILED|^ERROR" "$O/cuda_tests_ws.log" | head -20
ARMS="bf16,qmm,w8a8_ws,w8a8_mm[ws256p4],w8a8_mm[ws128p4],w8a8_mm[ws64p4],w8a8_mm[ws32p4],quant,i8gemm[ws256p4],torch"
timeout 130 python3 bench/cuda_bench.py --variants --kn 4096x1024,4096x4096,14336x4096,4096x14336 --m 128,512,2048 \
  --pairs 6 --arms "$ARMS" --out "$O" > "$O/bench.log" 2>&1
echo "bench rc=$?"; grep -hE "^M=" "$O/bench.log" | cut -c1-400
timeout 45 ncu --clock-control none -k regex:gemm_ws --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section Occupancy --section LaunchStats \
  python3 bench/cuda_bench.py --once "i8gemm[ws256p4]" --m 2048 --kn 4096x4096 > "$O/ncu_ws256.txt" 2>&1
echo "ncu ws rc=$?"; grep -E "custom_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|==ERROR|==PROF" "$O/ncu_ws256.txt" | head -16
T="$O/nvidia-h200.json"
timeout -s INT 230 python3 -m mlx_w8a8.tune --model llama-3-8b --m 16,64,128,512,2048 --pairs 10 \
  --table "$T" --no-progress > "$O/tune_prefill.log" 2>&1
echo "tune prefill rc=$?"; tail -2 "$O/tune_prefill.log"
timeout -s INT 110 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8 --pairs 10 \
  --table "$T" --no-progress > "$O/tune_decode.log" 2>&1
echo "tune decode rc=$?"; grep -A8 "decode check" "$O/tune_decode.log"
