#!/bin/bash
# Device run A, second set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s2_a.sh
# 1. tuner fidelity at M = 1 on Llama-3-8B's shapes: cold (weight copies) vs hot
#    (one weight) tuner timing, graph-build cost, dependent chain;
# 2. tune --model llama-3-8b at the decode buckets with the cold-weight tuner into a
#    user table; 3. the model benchmark (decode and prefill) with that table over the
#    shipped one.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s2_a}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1
timeout 110 python3 bench/tuner_fidelity.py --rounds 10 \
  --cases 1x4096x4096 1x1024x4096 1x14336x4096 1x4096x14336 1x128256x4096 > "$O/fidelity.log" 2>&1
echo "fidelity rc=$?"; grep -v '^{' "$O/fidelity.log" | tail -30
T="$O/decode.json"
timeout -s INT 220 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,2,4,8,16 --pairs 12 --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; tail -4 "$O/tune.log"
python3 - "$T" <<'P'
import json, sys
doc = json.load(open(sys.argv[1]))
for sec in doc["sections"]:
    for e in sec["entries"]:
        c = e["candidates"]
        times = {n: r.get("median_ns") for n, r in c.items() if r.get("median_ns")}
        print(f'M={e["m"]:>3} {e["n"]:>6}x{e["k"]:<6} -> {e["choice"]:<16} copies={e.get("weight_copies")} ' +
              " ".join(f"{n}={t/1e3:.1f}us" for n, t in sorted(times.items(), key=lambda kv: kv[1])))
P
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 1,128,2048 --decode 32 --rounds 6 \
  --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -8 "$O/model.log"
