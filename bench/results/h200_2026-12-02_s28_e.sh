#!/bin/bash
# Device run E, twenty-eighth set. Tree: branch quantize-tie-free (65ce0ba: the
# tie-free 16-bit rows in the straight path, main's kernel otherwise; 80 registers),
# with kernel texts in tmp_q/ (untracked): main/ (main's quantize.cu/.cuh) and
# tf_deferred/ (the tie-free straight path on branch quantize-deferred-settle's kernel,
# 64 registers):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s28_e.sh
# 1) kernel time, graphs off: the branch's quantize (`rowsum`) against main's text and
#    tf_deferred, each compared bit for bit with the branch's outputs first;
# 2) the GPU quantize and GEMV tests on the branch, on tf_deferred, and on a mutant of the
#    branch whose factor is 1 (x = amax / 2 left where x r puts it: must fail).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s28_e}
mkdir -p "$O"
MLX_USE_CUDA_GRAPHS=0 timeout 150 python3 bench/quantize_variants.py --m 512,2048,8192 --k 4096,14336 \
  --base tmp_q/main,tmp_q/tf_deferred --no-shapes > "$O/quant_tf.log" 2>&1
echo "variants rc=$?"; grep -E "^M=" "$O/quant_tf.log"
for v in branch tf_deferred factor_1; do
  rm -rf /tmp/mut && mkdir -p /tmp/mut && cp -r mlx_w8a8 tests /tmp/mut/
  f=/tmp/mut/mlx_w8a8/shaders/cuda/quantize.cuh
  case $v in
    tf_deferred) cp tmp_q/tf_deferred/quantize.cu tmp_q/tf_deferred/quantize.cuh /tmp/mut/mlx_w8a8/shaders/cuda/;;
    factor_1) sed -i 's/up ? 1.000000476837158203125f : 0.999999523162841796875f/up ? 1.0f : 1.0f/' $f
              grep -c "up ? 1.0f : 1.0f" $f;;
  esac
  if [ $v = factor_1 ]; then sel="quantize_every_16bit_value or quantize_bit_exact"; else sel="quantize or gemv"; fi
  (cd /tmp/mut && PYTHONPATH=/tmp/mut:$PYTHONPATH timeout 150 python3 -m pytest -q -n 8 tests/test_cuda.py \
     -k "$sel" > "$O/tests_$v.log" 2>&1)
  echo "tests $v rc=$? (branch, tf_deferred 0; factor_1 1 = caught)"; tail -n 1 "$O/tests_$v.log"
done
