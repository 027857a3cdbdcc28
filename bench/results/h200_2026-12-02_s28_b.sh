#!/bin/bash
# Device run B, twenty-eighth set. Tree: main with the TMA map change merged (76028a8 and
# the docs after it; no kernel or table change since): issue 9's per-shape rows on the
# shipped tree, in one run (the twenty-seventh set measured them on 814c682, before the
# merge; the raw GEMM was last measured in the twenty-third set):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s28_b.sh
# 1) `python -m mlx_w8a8.bench --cider`: the W8A8 linear against bf16 `mx.matmul` (and
#    the other arms) at M = 512, 2048, 8192 on 4096 x 4096 and the Llama-3-8B / Qwen-7B
#    MLP shapes, wall clock, 30 pairs;
# 2) the raw int8 GEMM (the tile tma_tile_for picks) against bf16 and torch._int_mm,
#    kernel time (CUPTI), CUDA graphs off;
# 3) the activation quantize against x.astype(int8), kernel time, graphs off, and the
#    copy bandwidth the floor is taken at.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s28_b}
mkdir -p "$O"
S="4096x4096,4096x14336,14336x4096,3584x18944,18944x3584"
CS=""
for m in 512 2048 8192; do
  for nk in 4096x4096 14336x4096 4096x14336 18944x3584 3584x18944; do CS="$CS ${m}x$nk"; done
done
timeout 240 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
  --json "$O/cider.jsonl" > "$O/cider.log" 2>&1
echo "cider rc=$?"; tail -n 20 "$O/cider.log"
MLX_USE_CUDA_GRAPHS=0 timeout 140 python3 bench/chain_timeline.py --m 2048,8192 --kn $S \
  --tiles auto --chain 40 > "$O/gemm_nographs.log" 2>&1
echo "gemm rc=$?"; grep -E "^(M=|MLX)" "$O/gemm_nographs.log"; grep -iE "error|Traceback" "$O/gemm_nographs.log" | head -5
MLX_USE_CUDA_GRAPHS=0 timeout 60 python3 bench/chain_timeline.py --quantize --m 512,2048,8192 \
  --kn 4096x1,14336x1 --chain 40 > "$O/quant_nographs.log" 2>&1
echo "quant rc=$?"; grep -E "^(M=|MLX)" "$O/quant_nographs.log"
python3 -c "import sys; sys.path.insert(0, 'bench'); import cuda_bench; print(f'torch copy bandwidth {cuda_bench.copy_bandwidth() / 1e9:.0f} GB/s (read + written)')"
