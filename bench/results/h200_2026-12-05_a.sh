#!/bin/bash
# Device run A, 2026-12-05: the CUDA code after its restructuring (one class per kernel,
# shared shader headers; launch- and SASS-identical to 64c2e01 per
# restamp_verify_2026-12-05.log), with the shipped table as re-stamped:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-05_a.sh
# 1) the 4-layer Llama-3-8B-shaped model bench, as for the README's table (fewer rounds);
# 2) python -m mlx_w8a8.check --report;
# 3) tests/test_cuda.py (the GPU suite, incl. the group-wise TMA GEMM never run before).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/h200_a}
mkdir -p "$O"
python3 -c "import cffi; print('cffi', cffi.__version__)"
timeout 170 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --warm-up --json "$O/model4.jsonl" > "$O/model4.log" 2>&1
echo "model4 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model4.log"
timeout 60 python3 -m mlx_w8a8.check --report "$O/check.json" > "$O/check.log" 2>&1
echo "check rc=$?"; tail -n 15 "$O/check.log"
N=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12" || echo "")
timeout 300 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py > "$O/tests_cuda.log" 2>&1
echo "tests_cuda rc=$?"; tail -n 25 "$O/tests_cuda.log"
