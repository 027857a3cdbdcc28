#!/bin/bash
# Device run B, fourteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s14_b.sh
# Run A: quantize_stream.cu was 1.4-5.6x slower than quantize.cu's block per row, and
# two of its tests failed (stages not a multiple of the consumers: a parity wait passed
# a phase early). This run: the tests again with each stage owned by one warp, then ncu
# of both kernels at M = 64, K = 14336 (one row per block: latency) and M = 2048,
# K = 4096 (the target shape), to see where a row's time goes.
# Ran the tree of branch quantize-stream before its commit (run A's kernel with each stage
# owned by one warp). Not on main.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s14_b}
mkdir -p "$O"
timeout 150 python3 -m pytest -q -n 4 tests/test_cuda.py -k "quantize_stream or rounding" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
cat > "$O/one.py" <<'PY'
import sys
import mlx.core as mx
from mlx_w8a8.kernels import cuda_launch as launch
m, k, stream = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
x = mx.random.normal((m, k)).astype(mx.bfloat16)
mx.eval(x)
for _ in range(3):
    mx.eval(launch.quantize(x, row_sum=True, stream=stream))
mx.synchronize()
PY
SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis"
for args in "64 14336 1" "64 14336 0" "2048 4096 1" "2048 4096 0"; do
  set -- $args
  MLX_USE_CUDA_GRAPHS=0 timeout 60 ncu --clock-control none $SEC -k regex:w8a8_quantize --launch-skip 2 --launch-count 1 \
    python3 "$O/one.py" $args > "$O/ncu_m$1_k$2_s$3.txt" 2>&1
  echo "ncu $args rc=$?"
  grep -E "Duration|Elapsed Cycles|SM Frequency|DRAM Throughput|Memory Throughput|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Stall|No Eligible|Active Warps Per" "$O/ncu_m$1_k$2_s$3.txt" | head -24
done
