#!/bin/bash
# Device run B, eleventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s11_b.sh
# Kernel times without MLX's CUDA graphs (run A: in a graph, independent launches of a
# chain run concurrently, so a kernel's own duration is inflated by its neighbours):
# the raw int8 GEMM on both TMA tiles against torch._int_mm and bf16 on the issue's
# shapes, the activation quantization against x.astype(int8) and torch's copy
# bandwidth, and ncu of the Qwen-7B gate/up GEMM (K = 3584, the slowest shape in run A).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s11_b}
mkdir -p "$O"
S="4096x4096,4096x14336,14336x4096,3584x18944,18944x3584"
MLX_USE_CUDA_GRAPHS=0 timeout 170 python3 bench/chain_timeline.py --m 2048,8192 --kn $S \
  --tiles tma256,tma128pp --chain 40 > "$O/gemm_nographs.log" 2>&1
echo "gemm rc=$?"; grep -E "^(M=|MLX)" "$O/gemm_nographs.log"; grep -iE "error|Traceback" "$O/gemm_nographs.log" | head -5
MLX_USE_CUDA_GRAPHS=0 timeout 90 python3 bench/chain_timeline.py --quantize --m 512,2048,8192 \
  --kn 4096x1,14336x1,3584x1,18944x1 --chain 40 > "$O/quant_nographs.log" 2>&1
echo "quant rc=$?"; grep -E "^(M=|MLX)" "$O/quant_nographs.log"; grep -iE "error|Traceback" "$O/quant_nographs.log" | head -5
python3 -c "import sys; sys.path.insert(0, 'bench'); import cuda_bench; print(f'torch copy bandwidth {cuda_bench.copy_bandwidth() / 1e9:.0f} GB/s (read + written)')"
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats"
timeout 70 ncu --clock-control none $SEC -k regex:gemm_ws_tma --launch-count 1 \
  python3 bench/cuda_bench.py --once i8gemm_tma --m 2048 --kn 3584x18944 > "$O/ncu_3584x18944.txt" 2>&1
echo "ncu rc=$?"; grep -E "gemm_ws|Duration|SM Frequency|Throughput|Busy|Issue Slots|Hit Rate" "$O/ncu_3584x18944.txt" | head -24
