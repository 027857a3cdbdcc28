#!/bin/bash
# Device run D, sixteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s16_d.sh
# The final tree: the straight-line quantize path with run C's table (shipped). Two
# mutants of the straight-line path that the quantize tests must catch (its packed
# words swapped; the path taken by rows without the fast path too), then the model:
# 4 Llama-3-8B layers, 10 rounds (as the fifteenth set's run D), and all 32 layers, 4
# rounds (as its run F).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s16_d}
mkdir -p "$O"
for mut in swapped_words no_fast_check; do
  rm -rf /tmp/mut && mkdir -p /tmp/mut && cp -r mlx_w8a8 tests /tmp/mut/
  f=/tmp/mut/mlx_w8a8/shaders/cuda/quantize.cu
  if [ $mut = swapped_words ]; then
    sed -i 's/out\[i \* blockDim.x\] = make_uint2(packed\[0\], packed\[1\]);/out[i * blockDim.x] = make_uint2(packed[1], packed[0]);/' $f
    grep -c "make_uint2(packed\[1\], packed\[0\])" $f
  else
    sed -i 's/const bool straight = GS == 0 \&\& qz.fast \&\& /const bool straight = GS == 0 \&\& /' $f
    grep -c "const bool straight = GS == 0 && kCached" $f
  fi
  (cd /tmp/mut && PYTHONPATH=/tmp/mut:$PYTHONPATH timeout 100 python3 -m pytest -q -n 4 tests/test_cuda.py \
     -k "quantize_bit_exact or quantize_row_sum_bit_exact" > "$O/mutant_$mut.log" 2>&1)
  echo "mutant $mut rc=$? (1 = caught)"; tail -n 1 "$O/mutant_$mut.log"
done
timeout 200 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 16,32,128,512,2048 --decode 32 \
  --rounds 10 --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "4-layer model rc=$?"; tail -n 10 "$O/model.log"
timeout 230 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 16,128,512,2048 --decode 32 \
  --rounds 4 --json "$O/model32.jsonl" > "$O/model32.log" 2>&1
echo "32-layer model rc=$?"; tail -n 8 "$O/model32.log"
