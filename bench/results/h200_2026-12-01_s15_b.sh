#!/bin/bash
# Device run B, fifteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s15_b.sh
# Run A: the FMA-remainder exact path took the M = 2048, K = 4096 quantize from 12.8 to
# 10.3 us, but its registers (71 per thread, 61 before) allow 14 blocks per SM instead of
# 16, so 2048 rows no longer fit one wave. The every-16-bit-value test (its bfloat16 input
# now built from bits: the GPU conversion flushed subnormals in run A), then four register
# variants of the new kernel against it, each a folder of kernel text (tmp_v/*; the
# shipped text of commit 613734d is tmp_base): q4 (4 chunks of 8 kept in registers
# instead of 8: 56 registers), p1 (registers hold the row for the maximum only, the codes
# pass re-reads it from L1/L2: 58), lb (__launch_bounds__(1024) on the generated kernel,
# capping it at 64 registers: 36 bytes spilled), p1lb (both: 60). Then ncu's per-line
# source counters of the new kernel at M = 2048, K = 4096.
# Ran the working tree of this set before its first commit.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s15_b}
mkdir -p "$O"
# The variant folders (made beside the tree before the run; these lines make the same text):
# tmp_base holds quantize.cu / quantize.cuh of commit 613734d (git show 613734d:<path>).
mkdir -p tmp_v
for v in q4 p1 lb p1lb; do mkdir -p tmp_v/$v; cp mlx_w8a8/shaders/cuda/quantize.cu{,h} tmp_v/$v/; done
sed -i 's/constexpr int kCached = sizeof(T) == 4 ? 4 : 8;/constexpr int kCached = sizeof(T) == 4 ? 4 : 4;/' tmp_v/q4/quantize.cu
for v in p1 p1lb; do
  sed -i 's|    decode8(cache\[i\], f);  // chunks past the row are never read: codes8 skips them|    load8(xr + min(tid + i * (int)blockDim.x, chunks - 1) * 8, f);  // re-read: L1/L2|' tmp_v/$v/quantize.cu
done
for v in lb p1lb; do
  sed -i 's|^// @@ requires quantize.cuh$|// @@ requires quantize.cuh\n#undef __global__\n#define __global__ __location__(global) __launch_bounds__(1024)|' tmp_v/$v/quantize.cu
done
timeout 200 python3 -m pytest -q -n 4 tests/test_cuda.py -k "every_16bit or rounding_boundaries" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
MLX_USE_CUDA_GRAPHS=0 timeout 240 python3 bench/quantize_variants.py --no-shapes \
  --base tmp_base,tmp_v/q4,tmp_v/p1,tmp_v/lb,tmp_v/p1lb --m 512,2048,8192 --k 4096 > "$O/variants.log" 2>&1
echo "variants rc=$?"
MLX_USE_CUDA_GRAPHS=0 timeout 120 python3 bench/quantize_variants.py --no-shapes \
  --base tmp_base,tmp_v/q4,tmp_v/p1 --m 2048 --k 14336 >> "$O/variants.log" 2>&1
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
MLX_USE_CUDA_GRAPHS=0 timeout 120 ncu --clock-control none --section InstructionStats --section SourceCounters \
  --section WarpStateStats --import-source no -k regex:w8a8_quantize --launch-skip 2 --launch-count 1 \
  -o "$O/quant" python3 "$O/one.py" 2048 4096 > "$O/ncu_run.log" 2>&1
echo "ncu rc=$?"; tail -2 "$O/ncu_run.log"
ncu -i "$O/quant.ncu-rep" --page source --csv --print-source sass > "$O/ncu_sass.csv" 2>&1
echo "sass rc=$? lines $(wc -l < "$O/ncu_sass.csv")"
rm -f "$O/quant.ncu-rep"
