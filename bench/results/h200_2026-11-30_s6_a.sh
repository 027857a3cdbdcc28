#!/bin/bash
# Device run A, sixth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s6_a.sh
# The quantize kernels' division-free rounding (quantize.cuh RowQuantizer, AbsMax):
# every CUDA test (new rows on rint's boundaries and a tiny-scale row in every test's
# activations), a mutant (no margin) that the boundary test must catch, then the new
# rowsum quantize against the previous revision's text (QB: quantize.cu, quantize.cuh,
# shape.cuh of the parent commit) and the linears against bf16, paired; ncu durations.
# (The ncu step's regex "quantize" caught MLX's own affine_quantize, the weights'
# quantization, not this package's kernel; that log is not kept: run A2 profiled ours.)
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s6_a}
QB=${QB:-.device-mlx/quant_base}
mkdir -p "$O"
timeout 200 python3 -m pytest -q -rs -n 8 -p no:cacheprovider tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -4 "$O/tests.log"
# Mutant: the fast path trusts n whenever y is not exactly on a boundary.
M=/tmp/s6_mutant; rm -rf "$M"; mkdir -p "$M"; cp -r mlx_w8a8 tests "$M"/
sed -i 's/kFastMargin = 0.49993896484375f/kFastMargin = 0.5f/' "$M/mlx_w8a8/shaders/cuda/quantize.cuh"
grep -c "kFastMargin = 0.5f" "$M/mlx_w8a8/shaders/cuda/quantize.cuh"
(cd "$M" && timeout 80 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_cuda.py \
  -k "test_quantize_on_rounding_boundaries" > "$O/mutant.log" 2>&1; echo "mutant rc=$? (1 = caught)")
tail -3 "$O/mutant.log"
timeout 200 python3 bench/cuda_bench.py --m 512,2048,8192 --kn 4096x4096,14336x4096 \
  --arms bf16,w8a8_tma,w8a8_mm_tma,quant,quant_base,quant_warp --pairs 8 --quant-base "$QB" \
  --out "$O" > "$O/bench.log" 2>&1
echo "bench rc=$?"; tail -8 "$O/bench.log"
timeout 90 ncu --clock-control none -k regex:quantize --launch-count 4 \
  python3 bench/cuda_bench.py --once quant,quant_base --m 2048 --kn 4096x4096 --quant-base "$QB" \
  > "$O/ncu_4096.txt" 2>&1
echo "ncu rc=$?"; grep -E "w8a8_quantize|Duration|Memory Throughput|Compute \(SM\)" "$O/ncu_4096.txt" | head -16
