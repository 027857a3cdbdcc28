#!/bin/bash
# Device run F, sixth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> QB=<folder> bash bench/results/h200_2026-11-30_s6_f.sh
# Fewer instructions per element in the quantize kernels (the row maximum on both 16-bit
# halves at once, the bfloat16 decode as one shift or mask): every CUDA test, the quantize
# against run B's text (QB: quantize.cu, quantize.cuh, shape.cuh of commit 123870a),
# the shipped table re-tuned with its checks (the text changed every CUDA linear's
# digest), and the 4-layer model on it. (Its first call ran the whole CUDA suite: 313
# passed, 1 failed on an oracle defect the boundary rows exposed, a float16 output beyond
# 65520 that rightly rounded to -inf; fixed in tests/oracle.py, so this call reruns the
# grouped, quantize and GEMV tests only: the kernel text is the same.)
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s6_f}
QB=${QB:-.device-mlx/quant_prev}
mkdir -p "$O"
timeout 120 python3 -m pytest -q -rs -n 8 -p no:cacheprovider tests/test_cuda.py -k "grouped or quantize or gemv" > "$O/tests.log" 2>&1
rc=$?
echo "tests rc=$rc"; tail -2 "$O/tests.log"
[ $rc -eq 0 ] || exit 3
timeout 100 python3 bench/cuda_bench.py --m 2048,8192 --kn 4096x4096,14336x4096 \
  --arms quant,quant_base --pairs 8 --quant-base "$QB" --out "$O" > "$O/bench.log" 2>&1
echo "bench rc=$?"; grep -A6 "^| M | K | quant_base" "$O/bench.log"
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 200 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8,128,512,2048 --pairs 8 \
  --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -iE -A9 "check \(|interrupted" "$O/tune.log" | cut -c1-200 | head -24
timeout 110 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 4 --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -8 "$O/model.log"
