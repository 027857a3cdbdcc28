#!/bin/bash
# Device run A, ninth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s9_a.sh
# The fused GEMV's sibling launches (gemv.cu fused_*_group*) and every GEMV test; the
# shipped table's M = 1 / 8 entries re-tuned (the GEMV's digest changed) with the decode
# check, which now judges sibling launches under their summed problem; the 4-layer model
# on the new table, linked against unlinked.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s9_a}
mkdir -p "$O"
timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py \
  -k "gemv or siblings_run_as_one" > "$O/tests.log" 2>&1
rc=$?
echo "tests rc=$rc"; tail -2 "$O/tests.log"
[ $rc -eq 0 ] || { grep -E "^(FAILED|E )" "$O/tests.log" | head -20; exit 3; }
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 200 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A9 "check \(|interrupted" "$O/tune.log" | cut -c1-200 | head -30
timeout 200 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 6 --unlinked --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -12 "$O/model.log"
