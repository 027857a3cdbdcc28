#!/bin/bash
# Device run C, twenty-eighth set. Tree: main (76028a8 + docs), with kernel texts in
# tmp_q/ (untracked; each folder's files replace the package's of the same name):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s28_c.sh
# Where the quantize's time over the copy floor goes at M = 2048, K = 4096 (run A: all
# re-read variants slower), and a variant that may take it to one wave:
# - bound_noexact / bound_nocheck / bound_nomath (quantize.cuh; NOT exact, timed as
#   bounds only): the exact path removed (its check kept), the check removed too, every
#   value's arithmetic removed (zero-cost codes); ptxas here 64 / 56 / 56 registers for
#   bfloat16 against main's 80: the exact path, inlined in the unrolled chunk loop while
#   the other cached chunks hold registers, is what takes the kernel to 80;
# - deferred (quantize.cu + quantize.cuh, exact; the text of branch
#   quantize-deferred-settle, 8620646): the chunks the fast path cannot decide are marked
#   and redone after the cached loops, re-read from L1/L2 through the exact path (64
#   registers: 16 blocks of 64 threads per SM, M = 2048 in one wave);
# then the GPU quantize and GEMV tests (gemv.cu shares quantize.cuh) on the deferred
# text, and on a mutant of it that never
# redoes a chunk (must fail).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s28_c}
mkdir -p "$O"
MLX_USE_CUDA_GRAPHS=0 timeout 200 python3 bench/quantize_variants.py --m 512,2048,8192 --k 4096,14336 \
  --base tmp_q/deferred --bound tmp_q/bound_noexact,tmp_q/bound_nocheck,tmp_q/bound_nomath \
  --no-shapes > "$O/quant_bounds.log" 2>&1
echo "variants rc=$?"; grep -E "^M=" "$O/quant_bounds.log"
for mut in deferred no_redo; do
  rm -rf /tmp/mut && mkdir -p /tmp/mut && cp -r mlx_w8a8 tests /tmp/mut/
  cp tmp_q/deferred/quantize.cu tmp_q/deferred/quantize.cuh /tmp/mut/mlx_w8a8/shaders/cuda/
  if [ $mut = no_redo ]; then
    sed -i 's/  while (redo) {/  while (false \&\& redo) {/' /tmp/mut/mlx_w8a8/shaders/cuda/quantize.cu
    grep -c "while (false && redo)" /tmp/mut/mlx_w8a8/shaders/cuda/quantize.cu
  fi
  if [ $mut = no_redo ]; then sel="quantize"; else sel="quantize or gemv"; fi
  (cd /tmp/mut && PYTHONPATH=/tmp/mut:$PYTHONPATH timeout 240 python3 -m pytest -q -n 8 tests/test_cuda.py \
     -k "$sel" > "$O/tests_$mut.log" 2>&1)
  echo "tests $mut rc=$? (deferred 0; no_redo 1 = caught)"; tail -n 1 "$O/tests_$mut.log"
done
