#!/bin/bash
# Device run A, third set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s3_a.sh
# After the header split (common.cuh / wgmma.cuh / quantize.cuh: every CUDA kernel's text
# changed) and the narrow warp-specialized tiles (128 x 64, 128 x 32; rows past M / N no
# longer copied; an idle consumer warpgroup issues no MMA):
# 1. the whole CUDA suite  2. every ws tile against bf16 and mlx-lm 8-bit on the Llama-3-8B
# projection shapes at M = 16..2048  3. ncu of the ws GEMM and the quantize kernel
# 4. per-launch cost of kernel text.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s3_a}
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | head -1
timeout 170 python3 -m pytest -q -rs -p no:cacheprovider -n 16 tests/test_cuda.py > "$O/cuda_tests.log" 2>&1
echo "cuda tests rc=$?"; tail -1 "$O/cuda_tests.log"; grep -E "^FAILED|^ERROR" "$O/cuda_tests.log" | head -20
ARMS="bf16,qmm,w8a8_ws,w8a8_mm[ws256p4],w8a8_mm[ws128p4],w8a8_mm[ws64p4],w8a8_mm[ws32p4],quant,i8gemm[ws256p4],torch"
timeout 170 python3 bench/cuda_bench.py --variants --kn 4096x1024,4096x4096,14336x4096 --m 16,128,512,2048 \
  --pairs 6 --arms "$ARMS" --out "$O" > "$O/bench_a.log" 2>&1
echo "bench a rc=$?"; mv "$O/cuda_bench.md" "$O/bench_a.md"; mv "$O/cuda_bench.json" "$O/bench_a.json"
timeout 90 python3 bench/cuda_bench.py --variants --kn 4096x14336 --m 16,128,512,2048 \
  --pairs 6 --arms "$ARMS" --out "$O" > "$O/bench_b.log" 2>&1
echo "bench b rc=$?"; mv "$O/cuda_bench.md" "$O/bench_b.md"; mv "$O/cuda_bench.json" "$O/bench_b.json"
grep -hE "^M=" "$O/bench_a.log" "$O/bench_b.log" | cut -c1-400
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats"
timeout 50 ncu --clock-control none -k regex:gemm_ws --launch-skip 1 --launch-count 1 $SECTIONS \
  python3 bench/cuda_bench.py --once "w8a8_mm[ws256p4]" --m 2048 --kn 4096x4096 > "$O/ncu_ws256.txt" 2>&1
echo "ncu ws rc=$?"
timeout 50 ncu --clock-control none -k regex:quantize_rowsum --launch-skip 3 --launch-count 1 $SECTIONS \
  python3 bench/cuda_bench.py --once quant --m 2048 --kn 4096x4096 > "$O/ncu_quant.txt" 2>&1
echo "ncu quant rc=$?"
grep -hE "custom_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|Registers Per" "$O/ncu_ws256.txt" "$O/ncu_quant.txt" | head -30
timeout 40 python3 bench/launch_overhead.py > "$O/launch_overhead.log" 2>&1
echo "launch overhead rc=$?"; tail -12 "$O/launch_overhead.log"
