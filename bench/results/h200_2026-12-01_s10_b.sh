#!/bin/bash
# Device run B, tenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s10_b.sh
# The TMA tiles as shipped (128 x 256 and ping-pong 128 x 128 with a producer warpgroup
# and setmaxnreg; 64 and 32 unchanged): every TMA test; a mutant without the ping-pong
# order barrier (a warpgroup may start its tile before the other passed its waits), whose
# exactness tests must fail; then the shipped table re-tuned at M = 128, 512, 2048 (the
# gemm_ws.cu digests changed) with the sibling and prefill checks.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s10_b}
mkdir -p "$O"
N=""
python3 -c "import xdist" 2>/dev/null && N="-n 4"
timeout 150 python3 -m pytest -q -p no:cacheprovider $N tests/test_cuda.py -k "tma" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
M=/tmp/s10_mutant
rm -rf "$M" && mkdir -p "$M" && cp -r mlx_w8a8 tests "$M"/
sed -i '/if (PP \&\& g > 0) mbar_wait(order0/d' "$M/mlx_w8a8/shaders/cuda/gemm_ws.cu"
grep -c "mbar_wait(order0" "$M/mlx_w8a8/shaders/cuda/gemm_ws.cu"
(cd "$M" && timeout 60 python3 -m pytest -q -p no:cacheprovider $N tests/test_cuda.py \
  -k "int8_gemm_ws_bit_exact and tma128pp" > "$O/mutant_tests.log" 2>&1)
echo "mutant tests rc=$? (must fail)"; tail -2 "$O/mutant_tests.log"; grep -E "^FAILED" "$O/mutant_tests.log" | head
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 300 python3 -m mlx_w8a8.tune --model llama-3-8b --m 128,512,2048 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -E "^ *(128|512|2048) " "$O/tune.log" | cut -c1-200
grep -iE -A12 "check \(|interrupted|skipped|problem\(s\) in" "$O/tune.log" | cut -c1-220 | head -40
