#!/bin/bash
# Device run G, twentieth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s20_g.sh
# Ran main at commit 17f36b9 (the fused call returns the activations only where another
# layer takes them; the shipped table of runs D and F). 1) The layer, functional-op and
# registry tests on the GPU. 2) bench/host_split.py at M = 512 (w8a8 = layer_run, now the
# output-only compiled call). 3) The 4-layer model benchmark once. Outputs in one archive.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s20_g}
W=$(mktemp -d)
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/test_nn.py tests/test_ops.py \
  tests/test_registry.py > "$W/tests.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$W/tests.log"; grep -E "^(FAILED|ERROR)" "$W/tests.log" | head
timeout 40 python3 bench/host_split.py --m 512 --rounds 5 > "$W/host_split.log" 2>&1
echo "host_split rc=$?"; grep -E "^M=" "$W/host_split.log" | grep -E "bf16|w8a8"
timeout 80 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 \
  --decode 32 --rounds 6 --json "$W/model4.jsonl" > "$W/model4.log" 2>&1
echo "model rc=$?"; grep -E "^(prefill|decode)" "$W/model4.log"
tar -C "$W" -cf "$O/s20_g.tar" .
