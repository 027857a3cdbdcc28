#!/bin/bash
# Device run A, fifteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s15_a.sh
# quantize.cuh's RowQuantizer settles the chunks its fast path cannot decide from the
# sign of an FMA remainder (no division), and its fast path is one FFMA shorter per value.
# Every quantize and GEMV test (the fused GEMV quantizes with the same code, and the new
# every-16-bit-value test), two mutants that must fail (the exact path's threshold
# doubled; the exact path removed), the launch against the previous text (tmp_base:
# quantize.cu and quantize.cuh of commit 613734d) and astype(int8) without CUDA graphs,
# and ncu's instruction counts at M = 2048, K = 4096.
# Ran the working tree of this set before its first commit (the kernel of the next commit).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s15_a}
mkdir -p "$O"
timeout 240 python3 -m pytest -q -n 4 tests/test_cuda.py -k "quantize or gemv" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
for mut in threshold_x2 no_exact_path; do
  rm -rf /tmp/mut && mkdir -p /tmp/mut && cp -r mlx_w8a8 tests /tmp/mut/
  f=/tmp/mut/mlx_w8a8/shaders/cuda/quantize.cuh
  if [ $mut = threshold_x2 ]; then
    sed -i 's/& 0x7f800000u), u);/\& 0x7f800000u), 2.f * u);/' $f; grep -c "2.f \* u" $f
  else
    sed -i 's/if (d >= kFastMargin) {/if (false) {/' $f; grep -c "if (false) {" $f
  fi
  (cd /tmp/mut && PYTHONPATH=/tmp/mut:$PYTHONPATH timeout 150 python3 -m pytest -q -n 4 tests/test_cuda.py \
     -k "every_16bit or rounding_boundaries or quantize_bit_exact" > "$O/mutant_$mut.log" 2>&1)
  echo "mutant $mut rc=$? (1 = caught)"; tail -1 "$O/mutant_$mut.log"
done
MLX_USE_CUDA_GRAPHS=0 timeout 200 python3 bench/quantize_variants.py --base tmp_base \
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
echo "ncu rc=$?"; grep -E "Executed Instructions|Issued Instructions|Warp Cycles Per|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Block Limit" "$O/ncu.txt" | head -16
