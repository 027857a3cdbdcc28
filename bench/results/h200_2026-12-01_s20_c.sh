#!/bin/bash
# Device run C, twentieth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s20_c.sh
# Ran main at commit 69afd84 (bound launches replayed through mx.compile; the tma128 rule;
# the shipped table stale under both). 1) The CUDA tests of the bound launches, layers,
# functional ops, registry and reference on the GPU (replay path). 2) bench/host_split.py
# with the replaying bound launches (arm w8a8 = layer_run, now replayed per launch; w8a8c
# = the pair in one mx.compile). 3) The quantize's thread count: shipped against 128 and
# 256 threads per row (kernel time, graphs off), to settle a rule by M before the table is
# re-measured.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s20_c}
mkdir -p "$O"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_nn.py tests/test_ops.py \
  tests/test_registry.py tests/test_reference.py tests/test_cuda.py \
  -k "not test_cuda.py or stages_equal or sibling or bound_launches or gemv or quantize_row_sum" \
  > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -n 2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head
timeout 120 python3 bench/host_split.py --m 128,512,2048 > "$O/host_split.log" 2>&1
echo "host_split rc=$?"; grep -E "^M=" "$O/host_split.log"
timeout 150 env MLX_USE_CUDA_GRAPHS=0 python3 bench/quantize_variants.py --m 16,64,128,512,1024,2048 \
  --k 4096,14336 > "$O/quantize_threads.log" 2>&1
echo "quantize rc=$?"; grep -vE "^\s*$" "$O/quantize_threads.log" | tail -40
