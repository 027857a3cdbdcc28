#!/bin/bash
# Device run C, seventeenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s17_c.sh
# Ran main (the sixteenth set's kernels and table). At T = 16 a prefill is encoded as one
# CUDA graph and then run, so host time and GPU time add up; the per-shape race (chains of
# launches, host overlapping GPU) chose the two-launch ws GEMM over the one-launch fused
# GEMV for 4096 x 4096 and 14336 x 4096 at M = 16. Does the GEMV prefill faster?
#  1. table gemv16.json: the shipped table with those two M = 16 entries choosing
#     cuda_int8_gemv (both timed and gate-passed there); the model benchmark on it and on
#     the shipped table, 4 layers, T = 16, 16 rounds each (each paired with bf16 and 8-bit);
#  2. the GPU timeline of both at T = 16 (wall, span, busy, kernels);
#  3. the tuner's default checks on the GPU: tune --model llama-3-8b --m 16 into a fresh
#     table with --check-layers left at auto (never run on a GPU before).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s17_c}
mkdir -p "$O"
python3 - "$O/gemv16.json" <<'PY'
import json, sys
t = json.load(open("mlx_w8a8/tables/nvidia-h200.json"))
for e in t["sections"][0]["entries"]:
    if e["m_bucket"] == 16 and (e["n"], e["k"]) in ((4096, 4096), (14336, 4096)):
        assert e["candidates"]["cuda_int8_gemv"]["status"] == "ok"
        print("was", e["n"], e["k"], e["choice"])
        e["choice"] = "cuda_int8_gemv"
json.dump(t, open(sys.argv[1], "w"), indent=1)
PY
for tab in shipped gemv16; do
  arg=""; [ $tab = gemv16 ] && arg="--table $O/gemv16.json"
  timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 16 --decode 0 \
    --rounds 16 $arg --json "$O/model_$tab.jsonl" > "$O/model_$tab.log" 2>&1
  echo "model $tab rc=$?"; tail -n 4 "$O/model_$tab.log" | head -2
done
for tab in shipped gemv16; do
  arg=""; [ $tab = gemv16 ] && arg="--table $O/gemv16.json"
  timeout 120 python3 bench/gpu_timeline.py --model llama-3-8b --layers 4 --tokens 16 --rounds 4 \
    $arg --out "$O/timeline_$tab.jsonl" > "$O/timeline_$tab.log" 2>&1
  echo "timeline $tab rc=$?"; grep -E "^---|wall_us|span_us|busy_us|^  kernels" "$O/timeline_$tab.log"
done
timeout 240 python3 -m mlx_w8a8.tune --model llama-3-8b --m 16 --table "$O/tune16.json" \
  --no-progress > "$O/tune16.log" 2>&1
echo "tune rc=$?"; grep -vE "^(16|--|M )" "$O/tune16.log" | tail -30
