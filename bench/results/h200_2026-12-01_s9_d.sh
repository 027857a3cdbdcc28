#!/bin/bash
# Device run D, ninth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s9_d.sh
# The M = 128 entries re-measured under the tuner's new rule (within the margin of the
# fastest, a kernel with a multi-weight form is preferred: q+k+v can run as one launch),
# with the sibling check at T = 128; the 4-layer model on the result, linked and
# unlinked; the GPU timeline of its prefill at T = 128 against bf16's.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s9_d}
mkdir -p "$O"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 200 python3 -m mlx_w8a8.tune --model llama-3-8b --m 128 --force --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -E "^ *128 " "$O/tune.log" | cut -c1-160 | head -12
grep -iE -A9 "check \(|interrupted" "$O/tune.log" | cut -c1-200 | head -20
timeout 170 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 6 --unlinked --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -9 "$O/model.log"
timeout 100 python3 bench/gpu_timeline.py --model llama-3-8b --layers 4 --tokens 128 --decode 0 \
  --rounds 4 --variants bf16,mlx_w8a8 --table "$T" \
  --out "$O/timeline.jsonl" > "$O/timeline.log" 2>&1
echo "timeline rc=$?"; grep -v "^    " "$O/timeline.log" | grep -v -i warn | tail -30
