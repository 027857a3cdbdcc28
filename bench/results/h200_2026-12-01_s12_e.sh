#!/bin/bash
# Device run E, twelfth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s12_e.sh
# A mutant whose accumulator sets are not cleared at a tile's first k-tile (the scale-d
# flag of the single chain, (kt | ks) != 0): test_int8_gemm_ws_accumulator_sets must fail
# on it. Then the W8A8 linear at M = 16-128 against mx.quantized_matmul 8-bit, wall
# clock, paired (python -m mlx_w8a8.bench): the TMA candidate on its tile rule, and the
# shipped table (run C's).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s12_e}
mkdir -p "$O"
N=""
python3 -c "import xdist" 2>/dev/null && N="-n 4"
M=/tmp/s12_mutant
rm -rf "$M" && mkdir -p "$M" && cp -r mlx_w8a8 tests "$M"/
sed -i 's/kt != 0 || ks >= ACC);/(kt | ks) != 0);/' "$M/mlx_w8a8/shaders/cuda/gemm_ws.cu"
grep -c "(kt | ks) != 0);" "$M/mlx_w8a8/shaders/cuda/gemm_ws.cu"
(cd "$M" && timeout 120 python3 -m pytest -q -p no:cacheprovider $N tests/test_cuda.py \
  -k "accumulator_sets" > "$O/mutant_tests.log" 2>&1)
echo "mutant tests rc=$? (must fail)"; tail -2 "$O/mutant_tests.log"; grep -E "^FAILED" "$O/mutant_tests.log" | head -30
C="16x4096x4096 16x1024x4096 16x14336x4096 16x4096x14336 64x4096x4096 64x1024x4096 64x14336x4096 64x4096x14336 128x4096x4096 128x1024x4096 128x14336x4096 128x4096x14336"
timeout 150 python3 -m mlx_w8a8.bench --baseline mlx_qmm --candidate cuda_w8a8_gemm_tma \
  --cases $C --pairs 30 --jsonl "$O/bench_tma.jsonl" > "$O/bench_tma.log" 2>&1
echo "bench tma rc=$?"; grep -vE "^\{" "$O/bench_tma.log" | tail -16
timeout 100 python3 -m mlx_w8a8.bench --baseline mlx_qmm --candidate-table mlx_w8a8/tables/nvidia-h200.json \
  --cases $C --pairs 30 --jsonl "$O/bench_table.jsonl" > "$O/bench_table.log" 2>&1
echo "bench table rc=$?"; grep -vE "^\{" "$O/bench_table.log" | tail -16
