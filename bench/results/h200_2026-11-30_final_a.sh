#!/bin/bash
# Device run A (NVIDIA H200, MLX 0.32.4 CUDA build), from the project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_final_a.sh
# 1. python -m mlx_w8a8.check  2. the CUDA tests  3. warp-specialized GEMM configs vs
# the wgmma GEMM and cuBLASLt  4. tune --model llama-3-8b into the table shipped as
# mlx_w8a8/tables/nvidia-h200.json  5. the model benchmark with that table.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/final_a}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1
timeout 60 python3 -m mlx_w8a8.check > "$O/check.log" 2>&1; echo "check rc=$?"; tail -2 "$O/check.log"
timeout 130 python3 -m pytest -q -p no:cacheprovider -n 16 tests/test_cuda.py > "$O/cuda_tests.log" 2>&1
echo "cuda tests rc=$?"; tail -1 "$O/cuda_tests.log"; grep -E "^FAILED|^ERROR" "$O/cuda_tests.log" | head -10
ARMS="bf16,w8a8,w8a8_ws,i8gemm,i8gemm[ws256],i8gemm[ws256p4],i8gemm[ws128p4],torch"
timeout 70 python3 bench/cuda_bench.py --variants --kn 4096x4096,14336x4096 --m 2048,8192 --pairs 8 --arms "$ARMS" --out "$O" > "$O/cuda_bench.log" 2>&1
echo "cuda bench rc=$?"; grep -E "^M=" "$O/cuda_bench.log" | cut -c1-300
T="$O/nvidia-h200.json"
timeout -s INT 200 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,2,4,8,16,64,128,512,2048 --pairs 12 --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; tail -3 "$O/tune.log"
timeout 110 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 1,128,512,2048 --decode 32 --rounds 6 --unshared --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -9 "$O/model.log"
