#!/bin/bash
# Device run C, twenty-eighth set. Tree: main (76028a8 + docs), with kernel texts in
# tmp_q/ (untracked; each folder's files replace the package's of the same name):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s28_c.sh
# Where the quantize's time over the copy floor goes at M = 2048, K = 4096 (run A: all
# re-read variants slower), and a variant that may take it to one wave:
# - bound_noexact / bound_nocheck / bound_nomath (quantize.cuh; NOT exact, timed as
#   bounds only): the exact path removed (its check kept), the check removed too, every
#   value's arithmetic removed (two decoded words stored as the codes); ptxas here 64 / 56 / 56 registers for
#   bfloat16 against main's 80: the exact path, inlined in the unrolled chunk loop while
#   the other cached chunks hold registers, is what takes the kernel to 80;
# - deferred (quantize.cu + quantize.cuh, exact; the text of branch
#   quantize-deferred-settle, 8620646): the chunks the fast path cannot decide are marked
#   and redone after the cached loops, re-read from L1/L2 through the exact path (64
#   registers: 16 blocks of 64 threads per SM, M = 2048 in one wave);
# then the GPU quantize and GEMV tests (gemv.cu shares quantize.cuh) on the deferred
# text, and on a mutant of it that never redoes a chunk (must fail).
# The bounds' text: main's quantize.cuh with these changes:
#  bound_noexact:
#     204,207c204
#     <     if (d >= kFastMargin) {
#     < #pragma unroll
#     <       for (int i = 0; i < 8; ++i) b[i] = settle_bits(f[i], __uint_as_float(b[i]));
#     <     }
#     ---
#     >     if (d >= kFastMargin) b[0] ^= 1u;  // BOUND: no exact path (not exact)
#  bound_nocheck:
#     201d200
#     <       d = fmaxf(d, fabsf(__fmaf_rn(f[i], r, -__fsub_rn(t, kRound))));
#     204,207c203
#     <     if (d >= kFastMargin) {
#     < #pragma unroll
#     <       for (int i = 0; i < 8; ++i) b[i] = settle_bits(f[i], __uint_as_float(b[i]));
#     <     }
#     ---
#     >     // BOUND: no check, no exact path (not exact)
#  bound_nomath:
#     195a196,198
#     >     packed[0] = __float_as_uint(f[0]); packed[1] = __float_as_uint(f[7]); return 0;  // BOUND: no arithmetic (not exact)
#     >   }
#     >   __device__ __forceinline__ int unused_fast_codes8(const float (&f)[8], uint32_t (&packed)[2]) const {
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
