#!/bin/bash
# One device call for the warp-specialized GEMM (gemm_ws.cu) and the one-warp-per-row
# quantize, run from the project root on the NVIDIA H200:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/cuda_ws_h200_2026-11-30_run.sh
# Writes tests.log, bench.log, cuda_bench{,_4096}.{json,md}, ncu.txt and mutant.log to the folder named by OUT.
# The logs bench/results/cuda_ws_h200_2026-11-30_{tests,bench,ncu,mutant}.* and
# _bench_{4096x4096,14336x4096}.{json,md} came from this script on commit 0163136 (gemm_ws.cu
# with one producer warp; the rootdir line of the test log edited out), in one call.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/cuda_ws_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
# 1. The whole CUDA suite: the new kernels and the old ones (their epilogue is shared now).
timeout 130 python3 -m pytest -v -rs -p no:cacheprovider -n 8 tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|error" "$O/tests.log" | tail -3; grep -E "FAILED|ERROR" "$O/tests.log" | head -20
# 2. Paired bench: bf16, old and new W8A8 linear, GEMM + epilogue alone, int32 GEMMs vs cuBLASLt,
#    both quantize bodies, on 4096x4096 (M = 512, 2048, 8192) and K = 14336, N = 4096 (M = 2048).
ARMS=qmm,bf16,w8a8,w8a8_ws,w8a8_mm,w8a8_mm_ws,i8gemm,i8gemm_ws,torch,quant,quant_warp
timeout 90 python3 bench/cuda_bench.py --kn 4096x4096 --m 512,2048,8192 --pairs 10 --arms $ARMS --out "$O" > "$O/bench.log" 2>&1
echo "bench 4096 rc=$?"
mv "$O/cuda_bench.md" "$O/cuda_bench_4096.md"; mv "$O/cuda_bench.json" "$O/cuda_bench_4096.json"
timeout 35 python3 bench/cuda_bench.py --kn 14336x4096 --m 2048 --pairs 10 --arms $ARMS --out "$O" >> "$O/bench.log" 2>&1
echo "bench 14336 rc=$?"; tail -14 "$O/bench.log"
# 3. Nsight Compute: the second ws launch and the first old wgmma launch at M = 8192, 4096^2.
timeout 45 ncu --clock-control none -k regex:gemm_w --launch-skip 1 --launch-count 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section Occupancy --section LaunchStats \
  python3 bench/cuda_bench.py --once i8gemm_ws,i8gemm --m 8192 --kn 4096x4096 > "$O/ncu.txt" 2>&1
echo "ncu rc=$?"; grep -E "custom_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible" "$O/ncu.txt" | head -30
# 4. Mutant (last: it edits the copy on the device): accumulate across tiles instead of
#    starting each tile from zero; the persistent-shape exactness tests must fail.
sed -i 's/(kt | ks) != 0/1/' mlx_w8a8/shaders/cuda/gemm_ws.cu
timeout 30 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "int8_gemm_ws_bit_exact and 2048" > "$O/mutant.log" 2>&1
echo "mutant rc=$? (1 = the tests caught it)"; tail -3 "$O/mutant.log"
