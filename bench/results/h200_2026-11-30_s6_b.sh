#!/bin/bash
# Device run B, sixth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s6_b.sh
# Run A (h200_2026-11-30_s6_a.sh): the division-free rounding alone was 0.92-1.09x the
# previous quantize; ncu: 41% of DRAM bandwidth, stalls on the L1TEX scoreboard (each
# chunk's load consumed before the next was issued). Here, with all loads issued first
# and 8 chunks per thread: every CUDA test, the quantize arms against the parent
# commit's text (QB) and the copy floor, the linears against bf16, and ncu.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s6_b}
QB=${QB:-.device-mlx/quant_base}
mkdir -p "$O"
timeout 200 python3 -m pytest -q -rs -n 8 -p no:cacheprovider tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$O/tests.log"
timeout 220 python3 bench/cuda_bench.py --m 512,2048,8192 --kn 4096x4096,14336x4096,4096x14336 \
  --arms bf16,w8a8_tma,quant,quant_base --pairs 8 --quant-base "$QB" \
  --out "$O" > "$O/bench.log" 2>&1
echo "bench rc=$?"; tail -22 "$O/bench.log"
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats"
A="python3 bench/cuda_bench.py --once quant_base --m 8192 --kn 4096x4096 --quant-base $QB"
timeout 80 ncu --clock-control none $S -k regex:w8a8_quantize_rowsum --launch-count 1 $A \
  > "$O/ncu_new.txt" 2>&1
echo "ncu rc=$?"; grep -E "Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Achieved Occ|Eligible Warps" "$O/ncu_new.txt"
