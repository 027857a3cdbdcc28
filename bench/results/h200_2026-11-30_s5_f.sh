#!/bin/bash
# Device run F, fifth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s5_f.sh
# Run E's tune measured nothing in 250 s: its one missing entry, lm_head at M = 2048, has
# its gate compare 2048 x 128256 outputs in float64 on the host. Here the model
# checks only, on buckets whose entries are all in the table (decode check at M = 1,
# sibling check at M = 128 and 512), then an ncu profile of the TMA int32 GEMM.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s5_f}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 150 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,128,512 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A9 "check|interrupted" "$O/tune.log" | cut -c1-200 | head -40
timeout 75 ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section MemoryWorkloadAnalysis -k regex:gemm_ws_tma --launch-count 1 \
  python3 bench/cuda_bench.py --once i8gemm_tma --m 2048 --kn 4096x14336 > "$O/ncu.txt" 2>&1
echo "ncu rc=$?"; grep -E "Duration|Throughput|Busy|Issue Slots|Eligible|Stall|Hit Rate" "$O/ncu.txt" | head -30
