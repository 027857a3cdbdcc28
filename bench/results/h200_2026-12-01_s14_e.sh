#!/bin/bash
# Device run E, fourteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s14_e.sh
# Run D: 27% of the quantize's warp chunks took the exact path (a division for all 8
# values of a lane's chunk, and the whole warp with it). quantize.cuh now sends only the
# values near a half-integer to the division. Every quantize and GEMV test (the fused
# GEMV quantizes with the same code), a mutant with the fallback removed (must fail),
# then the launch against the previous text (tmp_base: quantize.cu and quantize.cuh of
# commit 3220aa3) and astype(int8), kernel time without CUDA graphs.
# Ran the tree of branch quantize-per-value-fallback, commit eb7f90d. Not on main.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s14_e}
mkdir -p "$O"
timeout 200 python3 -m pytest -q -n 4 tests/test_cuda.py -k "quantize or gemv" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
rm -rf /tmp/mut && mkdir -p /tmp/mut && cp -r mlx_w8a8 tests /tmp/mut/
sed -i 's/if (d >= kFastMargin) {/if (false) {/' /tmp/mut/mlx_w8a8/shaders/cuda/quantize.cuh
grep -c "if (false) {" /tmp/mut/mlx_w8a8/shaders/cuda/quantize.cuh
(cd /tmp/mut && PYTHONPATH=/tmp/mut:$PYTHONPATH timeout 120 python3 -m pytest -q -n 4 tests/test_cuda.py -k "rounding or quantize_bit_exact" > "$O/mutant.log" 2>&1)
echo "mutant (fallback removed) rc=$? (1 = caught)"; tail -1 "$O/mutant.log"
MLX_USE_CUDA_GRAPHS=0 timeout 200 python3 bench/quantize_variants.py --base tmp_base \
  --m 64,512,2048,8192 --k 4096,14336 > "$O/variants.log" 2>&1
echo "variants rc=$?"; grep -vE "UserWarning|_warn_once" "$O/variants.log"
