#!/bin/bash
# Device run B, eighteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s18_b.sh
# Ran main at commit 0c614e8 (the ops decide once and bind once; tune --op).
#  1. tune --op int8_matmul / quantize_activation on the Llama-3-8B and Qwen2.5-7B
#     projection shapes into a scratch table: which kernel the raw ops should run where
#     no table decides (the built-in prior has no rule for them: they ran the exact
#     MLX-ops kernel);
#  2. bench --cider again at M = 512 and 2048 (run A's shapes): the W8A8 arm now runs
#     the kernel the op runs unforced, through bound launches; the raw arm the scratch
#     table's choice (MLX_W8A8_TUNING_TABLE);
#  3. the raw GEMM at 18944 x 3584, M = 8192 again (kernel time, 7 rounds): run A's
#     1.56x torch there against the eleventh set's 1.42x.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s18_b}
mkdir -p "$O"
T="$O/raw.json"
timeout 230 python3 -m mlx_w8a8.tune --op int8_matmul --shapes mlp attn --m 1,16,128,2048 \
  --pairs 10 --table "$T" > "$O/tune_int8.log" 2>&1
echo "tune int8 rc=$?"; tail -n 40 "$O/tune_int8.log"
timeout 70 python3 -m mlx_w8a8.tune --op quantize_activation --shapes mlp attn --m 1,16,128,2048 \
  --pairs 10 --table "$T" > "$O/tune_quant.log" 2>&1
echo "tune quant rc=$?"; tail -n 22 "$O/tune_quant.log"
CS=""
for m in 512 2048; do
  for nk in 4096x4096 14336x4096 4096x14336 18944x3584 3584x18944; do CS="$CS ${m}x$nk"; done
done
MLX_W8A8_TUNING_TABLE="$T" timeout 170 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
  --json "$O/cider.jsonl" > "$O/cider.log" 2>&1
echo "cider rc=$?"; grep -v "^{" "$O/cider.log" | tail -n 14
MLX_USE_CUDA_GRAPHS=0 timeout 60 python3 bench/chain_timeline.py --m 8192 --kn 18944x3584 \
  --tiles auto --chain 40 --rounds 7 > "$O/gemm_qwen_down.log" 2>&1
echo "gemm rc=$?"; grep -E "^(M=|MLX)" "$O/gemm_qwen_down.log"
