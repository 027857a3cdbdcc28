#!/bin/bash
# Device run C, twenty-third set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s23_c.sh
# Ran main at commit 4a48829 (kernels and shipped table of the twenty-first set). Issue 9's
# per-shape rows again in one run, on the final tree, with the eighteenth set's run A steps
# unchanged:
#  1. `python -m mlx_w8a8.bench --cider` (wall clock, chains of independent launches, MLX's
#     CUDA graphs on): the W8A8 linear as the shipped table decides it, against mx.matmul
#     bf16 and mx.quantized_matmul 8-bit, at M = 512, 2048, 8192 on 4096 x 4096 and the
#     Llama-3-8B / Qwen-7B MLP shapes;
#  2. kernel time without graphs (CUPTI, bench/chain_timeline.py): the raw int8 GEMM on
#     the tile tma_tile_for picks against torch._int_mm, M = 2048 and 8192;
#  3. the whole linear's GPU time without graphs (--linear) at M = 512, 2048;
#  4. the activation quantize against x.astype(int8) and the copy floor.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s23_c}
mkdir -p "$O"
S="4096x4096,4096x14336,14336x4096,3584x18944,18944x3584"
CS=""
for m in 512 2048 8192; do
  for nk in 4096x4096 14336x4096 4096x14336 18944x3584 3584x18944; do CS="$CS ${m}x$nk"; done
done
timeout 230 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
  --json "$O/cider.jsonl" > "$O/cider.log" 2>&1
echo "cider rc=$?"; tail -n 20 "$O/cider.log"
MLX_USE_CUDA_GRAPHS=0 timeout 130 python3 bench/chain_timeline.py --m 2048,8192 --kn $S \
  --tiles auto --chain 40 > "$O/gemm_nographs.log" 2>&1
echo "gemm rc=$?"; grep -E "^(M=|MLX)" "$O/gemm_nographs.log"; grep -iE "error|Traceback" "$O/gemm_nographs.log" | head -5
MLX_USE_CUDA_GRAPHS=0 timeout 50 python3 bench/chain_timeline.py --quantize --m 512,2048,8192 \
  --kn 4096x1,14336x1 --chain 40 > "$O/quant_nographs.log" 2>&1
echo "quant rc=$?"; grep -E "^(M=|MLX)" "$O/quant_nographs.log"
python3 -c "import sys; sys.path.insert(0, 'bench'); import cuda_bench; print(f'torch copy bandwidth {cuda_bench.copy_bandwidth() / 1e9:.0f} GB/s (read + written)')"
MLX_USE_CUDA_GRAPHS=0 timeout 120 python3 bench/chain_timeline.py --linear --m 512,2048 --kn $S \
  --chain 20 --rounds 3 > "$O/linear_nographs.log" 2>&1
echo "linear rc=$?"; grep -E " dep " "$O/linear_nographs.log"
