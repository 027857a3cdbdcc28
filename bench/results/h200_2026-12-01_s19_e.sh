#!/bin/bash
# Device run E, nineteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s19_e.sh
# Ran branch tma-coop at commit cbe6945 (tma_tile_for: cooperative 128 x 128 tiles where a
# block gets one tile). That stales every entry of the shipped table that measured
# cuda_w8a8_gemm_tma, so:
#  1. the TMA tiles' and the TMA W8A8 candidate's exactness tests on the GPU (the new
#     tma128 tile forced in every tile test; the candidate on the rule's picks); no tune
#     if any fails;
#  2. the shipped table re-measured at M = 16-2048 as the seventeenth set's run E did
#     (--force, 30 pairs, the sibling and prefill checks on all 32 layers) into a copy of
#     it; run F does M = 1 and 8.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s19_e}
mkdir -p "$O"
cp mlx_w8a8/tables/nvidia-h200.json "$O/tune.json"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
  -k "(tma128 and not tma128pp) or gemm_tma" > "$O/tests.log" 2>&1
rc=$?; echo "tests rc=$rc"; tail -n 2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head
if [ $rc -ne 0 ]; then echo "tests did not pass: no tune"; exit 0; fi
timeout -s INT 430 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 16,64,128,512,2048 \
  --table "$O/tune.json" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune.log" | tail -45
