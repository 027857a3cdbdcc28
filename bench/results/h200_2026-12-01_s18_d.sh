#!/bin/bash
# Device run D, eighteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s18_d.sh
# Ran main at commit dbcf2a3 plus bench/compile_probe.py (committed after; the first
# call ran an earlier probe without the float-model column or --first, whose bfloat16
# cases failed on numpy's missing bfloat16; the log is the second call's). Run C ran
# tests/test_nn.py on the GPU for the first time and two mx.compile tests failed (one with
# compiled outputs of all 1.0, with inputs=model.state). The probe tells which kernel
# choice differs under mx.compile and whether stock nn.QuantizedLinear does the same:
# float32 x of 4 rows (the tests'), bfloat16 of 4, 32 and 256 rows (mx.quantized_matmul,
# the cp.async and the TMA W8A8 GEMMs as the prior decides).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s18_d}
mkdir -p "$O"
for a in "--rows 4 --dtype float32" "--rows 4 --dtype float32 --first exact" \
         "--rows 4 --dtype bfloat16" "--rows 32 --dtype bfloat16" "--rows 256 --dtype bfloat16"; do
  timeout 100 python3 bench/compile_probe.py $a 2>&1 | grep -vE "UserWarning|_warn_once"
done > "$O/probe.log"
cat "$O/probe.log"
