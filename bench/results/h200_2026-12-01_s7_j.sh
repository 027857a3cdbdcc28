#!/bin/bash
# Device run J, seventh set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s7_j.sh
# W8A8 decode was bimodal across rounds in runs G and I (976-1637 tok/s, bf16 steady):
# the decode alone, 12 rounds, on the shipped table and on a diagnostic copy of it whose
# M = 1 entries say mx.quantized_matmul (the decode check's reference) everywhere, to see
# whether the GEMV is where the two modes come from. The copy is not shipped.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s7_j}
mkdir -p "$O"
python3 - "$O/qmm_decode.json" <<'PY'
import json, sys
t = json.load(open("mlx_w8a8/tables/nvidia-h200.json"))
for e in t["sections"][0]["entries"]:
    if e["m_bucket"] == 1:
        e["choice"] = "mlx_qmm"
        e.pop("decode_check", None)
json.dump(t, open(sys.argv[1], "w"))
PY
for arm in shipped qmm_decode; do
  T=mlx_w8a8/tables/nvidia-h200.json; [ $arm = qmm_decode ] && T="$O/qmm_decode.json"
  timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 16 --decode 32 \
    --rounds 12 --table "$T" --json "$O/$arm.jsonl" > "$O/$arm.log" 2>&1
  echo "$arm rc=$?"; tail -4 "$O/$arm.log"
done
