#!/bin/bash
# Device check of the producer-warpgroup ws configs (ws256p4 / ws128p4, the default of
# cuda_launch.ws_tile_for since commit 3e1db17; never run on a GPU before this script), in
# one call on the NVIDIA H200, from the project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/cuda_ws_p4_verify.sh
# Writes tests.log, bench.log, cuda_bench{,_4096}.{json,md} and ncu.txt to the folder named by OUT.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/cuda_ws_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
# 1. The whole CUDA suite (every WS_CONFIGS tile is forced in the ws tests).
timeout 170 python3 -m pytest -v -rs -p no:cacheprovider -n 8 tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|error" "$O/tests.log" | tail -2; grep -E "FAILED|ERROR" "$O/tests.log" | head -20
# 2. One producer warp vs a producer warpgroup vs the wgmma kernel vs cuBLASLt, paired.
ARMS="bf16,w8a8,w8a8_ws,w8a8_mm,w8a8_mm_ws,i8gemm,i8gemm_ws,i8gemm[ws256],i8gemm[ws256p4],i8gemm[ws128p4],torch"
timeout 80 python3 bench/cuda_bench.py --variants --kn 4096x4096 --m 512,2048,8192 --pairs 10 --arms "$ARMS" --out "$O" > "$O/bench.log" 2>&1
echo "bench 4096 rc=$?"
mv "$O/cuda_bench.md" "$O/cuda_bench_4096.md"; mv "$O/cuda_bench.json" "$O/cuda_bench_4096.json"
timeout 50 python3 bench/cuda_bench.py --variants --kn 14336x4096,4096x14336 --m 2048 --pairs 10 --arms "$ARMS" --out "$O" >> "$O/bench.log" 2>&1
echo "bench mlp rc=$?"; grep -E "^M=" "$O/bench.log" | cut -c1-330; tail -6 "$O/bench.log"
# 3. Nsight Compute: the second ws (p4) launch and the first wgmma launch, M = 8192, 4096^2.
timeout 45 ncu --clock-control none -k regex:gemm_w --launch-skip 1 --launch-count 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section Occupancy --section LaunchStats \
  python3 bench/cuda_bench.py --once i8gemm_ws,i8gemm --m 8192 --kn 4096x4096 > "$O/ncu.txt" 2>&1
echo "ncu rc=$?"; grep -E "custom_kernel|Duration|Compute \(SM\) Throughput|L2 Cache Throughput|Issue Slots Busy|Warp Cycles Per Issued" "$O/ncu.txt" | head -16
