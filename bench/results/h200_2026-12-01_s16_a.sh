#!/bin/bash
# Device run A, sixteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s16_a.sh
# Ran the branch quantize-straight rebased on main (the working tree; its two commits:
# a straight-line path for blocks whose threads hold exactly the row, then a warp's
# undecided chunks settled through shared memory). tmp_base/main holds main's
# quantize.cu / quantize.cuh, tmp_base/straight1 the first commit's; tmp_main holds
# main's package (for the decode run, which measures the shipped table).
# 1. every quantize and GEMV test on the branch; 2. the launch against main's text and
# the first commit's, astype(int8) and the copy floor, graphs off; 3. ncu of the branch
# at M = 2048, K = 4096; 4. main's package: 32-layer decode on the shipped table.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s16_a}
mkdir -p "$O"
timeout 200 python3 -m pytest -q -n 4 tests/test_cuda.py -k "quantize or gemv" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -n 2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
MLX_USE_CUDA_GRAPHS=0 timeout 200 python3 bench/quantize_variants.py --base tmp_base/main,tmp_base/straight1 \
  --m 64,512,2048,8192 --k 4096,14336 > "$O/variants.log" 2>&1
echo "variants rc=$?"; grep -vE "UserWarning|_warn_once" "$O/variants.log"
cat > "$O/one.py" <<'PY'
import sys
import mlx.core as mx
from mlx_w8a8.kernels import cuda_launch as launch
m, k = int(sys.argv[1]), int(sys.argv[2])
x = mx.random.normal((m, k)).astype(mx.bfloat16)
mx.eval(x)
for _ in range(3):
    mx.eval(launch.quantize(x, row_sum=True))
mx.synchronize()
PY
MLX_USE_CUDA_GRAPHS=0 timeout 120 ncu --clock-control none --section InstructionStats --section WarpStateStats \
  --section SpeedOfLight --section LaunchStats --section Occupancy -k regex:w8a8_quantize --launch-skip 2 --launch-count 1 \
  python3 "$O/one.py" 2048 4096 > "$O/ncu.txt" 2>&1
echo "ncu rc=$?"; grep -E "Executed Instructions|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Block Limit Reg|Waves" "$O/ncu.txt" | head -12
(cd tmp_main && timeout 200 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 1 --decode 32 \
  --rounds 6 --json "$O/decode32.jsonl" > "$O/decode32.log" 2>&1)
echo "32-layer decode (main, shipped table) rc=$?"; tail -n 6 "$O/decode32.log"
