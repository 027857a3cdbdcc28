#!/bin/bash
# Device run C, thirteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s13_c.sh
# The table re-measured in dependent chains (run B, now shipped): the model (4 and 32
# Llama-3-8B layers) at T = 16-2048 and decode, then the qualification bench, the
# shipped table against mx.quantized_matmul at M = 16, 64, 128 in dependent chains (the
# bench's default now) and in independent ones (--independent, the earlier sets' chains).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s13_c}
mkdir -p "$O"
timeout 170 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 16,32,64,128,512,2048 --decode 32 \
  --rounds 6 --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model rc=$?"; tail -10 "$O/model.log"
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 16,128,512,2048 --decode 32 \
  --rounds 4 --json "$O/model32.jsonl" > "$O/model32.log" 2>&1
echo "32-layer model rc=$?"; tail -8 "$O/model32.log"
C="16x4096x4096 16x1024x4096 16x14336x4096 16x4096x14336 64x4096x4096 64x1024x4096 64x14336x4096 64x4096x14336 128x4096x4096 128x1024x4096 128x14336x4096 128x4096x14336"
timeout 110 python3 -m mlx_w8a8.bench --baseline mlx_qmm --candidate-table mlx_w8a8/tables/nvidia-h200.json \
  --cases $C --pairs 30 --jsonl "$O/bench_table.jsonl" > "$O/bench_table.log" 2>&1
echo "bench table (dependent) rc=$?"; grep -vE "^\{" "$O/bench_table.log" | tail -16
timeout 90 python3 -m mlx_w8a8.bench --baseline mlx_qmm --candidate-table mlx_w8a8/tables/nvidia-h200.json \
  --cases $C --pairs 30 --independent --jsonl "$O/bench_table_indep.jsonl" > "$O/bench_table_indep.log" 2>&1
echo "bench table (independent) rc=$?"; grep -vE "^\{" "$O/bench_table_indep.log" | tail -16
