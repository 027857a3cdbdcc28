#!/bin/bash
# Device run A, twenty-eighth set. Tree: main (the TMA map change merged, 76028a8), with
# quantize variants in tmp_q/keep{0,2,4,6}/quantize.cu (untracked, from main's
# quantize.cu: the first N chunks of 8 kept in registers between the two passes, the
# rest re-read from L1/L2 in the second pass; ptxas here: 56 / 62 / 69 / 72 registers
# for bfloat16 against main's 80):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s28_a.sh
# 1) the quantize variants against main's kernel, kernel time, graphs off, each compared
#    bit for bit with main's outputs first (bench/quantize_variants.py);
# 2) the 4-layer model on the merged tree (issue 9's model rows; the twenty-seventh
#    set's run E timed out at 100 s in its warm-up on a fresh machine);
# 3) the TMA rows test on the GPU against a mutant that never writes M into A's tensor
#    map (gemm_ws.cu without tma_replace_rows): the prototype's 128 rows stay, so M = 300
#    reads 172 rows as zeros. The control runs the shipped text first.
# The variants' text: main's quantize.cu with this change, N = 0, 2, 4, 6 (diff for N = 4):
#   47a48
#   >   constexpr int kKeep = sizeof(T) == 4 ? (kCached < 4 ? kCached : 4) : 4;  // VARIANT: chunks kept in registers, the rest re-read
#   95c96,97
#   <         decode8(cache[i], f);
#   ---
#   >         if (i < kKeep) decode8(cache[i], f);
#   >         else load8(xr + (tid + i * (int)blockDim.x) * 8, f);
#   106c108,109
#   <     decode8(cache[i], f);  // chunks past the row are never read: codes8 skips them
#   ---
#   >     if (i < kKeep) decode8(cache[i], f);  // chunks past the row are never read: codes8 skips them
#   >     else load8(xr + min(tid + i * (int)blockDim.x, chunks - 1) * 8, f);
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s28_a}
mkdir -p "$O"
MLX_USE_CUDA_GRAPHS=0 timeout 150 python3 bench/quantize_variants.py --m 512,2048,8192 --k 4096,14336 \
  --base tmp_q/keep0,tmp_q/keep2,tmp_q/keep4,tmp_q/keep6 --no-shapes > "$O/quant_variants.log" 2>&1
echo "variants rc=$?"; grep -E "^M=" "$O/quant_variants.log"
A="--model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 --rounds 6 --new-lengths --warm-up"
timeout 260 python3 -m mlx_w8a8.bench $A --json "$O/model4.jsonl" > "$O/model4.log" 2>&1
echo "model4 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model4.log"
for mut in control no_rows; do
  rm -rf /tmp/mut && mkdir -p /tmp/mut && cp -r mlx_w8a8 tests /tmp/mut/
  f=/tmp/mut/mlx_w8a8/shaders/cuda/gemm_ws.cu
  if [ $mut = no_rows ]; then
    sed -i 's#^ *tma_replace_rows(smem_addr(maps_s), M, M < BM ? M : BM);#        // mutant: rows not written#' $f
    grep -c "mutant: rows not written" $f
  fi
  (cd /tmp/mut && PYTHONPATH=/tmp/mut:$PYTHONPATH timeout 90 python3 -m pytest -q -x tests/test_cuda.py \
     -k "tma_activation_map_takes_each_launchs_rows" > "$O/mutant_$mut.log" 2>&1)
  echo "mutant $mut rc=$? (control 0; mutant 1 = caught, 124 = hung, caught by the timeout)"; tail -n 3 "$O/mutant_$mut.log"
done
