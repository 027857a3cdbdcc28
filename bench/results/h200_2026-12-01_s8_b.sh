#!/bin/bash
# Device run B, eighth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s8_b.sh
# Split-K in thread-block clusters (gemm_ws.cu W8A8_CLUSTER, SPLIT_CONFIGS): the CUDA
# tests; a mutant (rank 0 drops its peers' partial sums) that the split tests must fail;
# then the shipped table re-tuned with both checks (every CUDA digest changed).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s8_b}
mkdir -p "$O"
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py > "$O/tests.log" 2>&1
rc=$?
echo "tests rc=$rc"; tail -3 "$O/tests.log"
[ $rc -eq 0 ] || { grep -E "^(FAILED|E )" "$O/tests.log" | head -20; exit 3; }
# Mutant: rank 0 adds 0 * its peers' first partial sums of each chunk.
M=/tmp/s8_mutant; rm -rf "$M"; mkdir -p "$M"; cp -r mlx_w8a8 tests "$M"/
sed -i 's/d\[4 \* c\] += v.x;/d[4 * c] += 0 * v.x;/' "$M/mlx_w8a8/shaders/cuda/gemm_ws.cu"
grep -c "0 \* v.x" "$M/mlx_w8a8/shaders/cuda/gemm_ws.cu"
(cd "$M" && MLX_W8A8_CACHE_DIR=/tmp/s8_mutant_cache timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/test_cuda.py -k "split_k_matches" > "$O/mutant.log" 2>&1; echo "mutant rc=$? (expected 1)")
tail -2 "$O/mutant.log"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 300 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8,128,512,2048 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A9 "check \(|interrupted" "$O/tune.log" | cut -c1-200 | head -30
