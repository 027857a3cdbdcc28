#!/bin/bash
# Device run D, twentieth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s20_d.sh
# Ran main at commit fab117e: the tma128 rule, bound launches replayed, a W8A8 linear's two
# launches one compiled call (registry.fuse_stages). The shipped table is stale under these
# (digests). 1) The layer, functional-op and registry tests on the GPU (the fused path).
# 2) The table re-measured at M = 16-2048 as the seventeenth set's run E did (Llama-3-8B
# shapes, 30 pairs, sibling and prefill checks on all 32 layers), into a copy of the
# shipped table (M = 1 and 8 follow in run E).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s20_d}
mkdir -p "$O"
cp mlx_w8a8/tables/nvidia-h200.json "$O/tune.json"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_nn.py tests/test_ops.py \
  tests/test_registry.py > "$O/tests.log" 2>&1
rc=$?; echo "tests rc=$rc"; tail -n 2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head
if [ $rc -ne 0 ]; then echo "tests did not pass: no tune"; exit 0; fi
timeout -s INT 450 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 16,64,128,512,2048 \
  --table "$O/tune.json" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune.log" | tail -40
