#!/bin/bash
# Device run C, fifth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s5_c.sh
# The TMA/cp.async bit-identity test again (run B: its K = 48 case was a test defect,
# group size 64 does not divide 48; now K = 96, group 32), then the shipped table tuned
# anew for the prefill buckets with the TMA candidates (every digest changed: the ws
# kernel file gained the tma_* bodies), the sibling check included (auto).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s5_c}
mkdir -p "$O"
timeout 100 python3 -m pytest -q -rs -n 8 -p no:cacheprovider tests/test_cuda.py \
  -k "test_tma_producer_matches_cp_async" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$O/tests.log"
T="$O/nvidia-h200.json"
timeout -s INT 400 python3 -m mlx_w8a8.tune --model llama-3-8b --m 128,512,2048 --pairs 8 \
  --table "$T" --no-progress > "$O/tune_prefill.log" 2>&1
echo "tune prefill rc=$?"; tail -12 "$O/tune_prefill.log" | cut -c1-220
python3 -m mlx_w8a8.tune --show "$T" > "$O/table_show.txt" 2>&1; cut -c1-150 "$O/table_show.txt" | head -40
