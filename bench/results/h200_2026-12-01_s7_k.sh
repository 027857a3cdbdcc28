#!/bin/bash
# Device run K, seventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s7_k.sh
# The fused GEMV's per-channel grid at two blocks per SM (was one: 8 warps per SM; run J
# tied the bimodal decode to the GEMVs): the GEMV tests, the M = 1 and 8 entries re-tuned
# with the decode check (the grid is in cuda_int8_gemv's digest), the decode on the result.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s7_k}
mkdir -p "$O"
timeout 70 python3 -m pytest -q -rs -n 8 -p no:cacheprovider tests/test_cuda.py -k gemv > "$O/tests.log" 2>&1
rc=$?
echo "tests rc=$rc"; tail -2 "$O/tests.log"
[ $rc -eq 0 ] || exit 3
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 80 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8 --force --pairs 8 \
  --decode-check on --sibling-check off --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A5 "check \(|interrupted" "$O/tune.log" | cut -c1-200 | head -8
timeout 60 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 16 --decode 32 \
  --rounds 12 --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -4 "$O/model.log"
