#!/bin/bash
# Device run B, nineteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s19_b.sh
# Ran main at commit 3a19af2 plus (committed after this run) run A's test fixes (tests
# that assumed a CPU backend, a clearer message from the compile comparison) and the
# functional w8a8_linear's kept call (one lookup per repeated call).
#  1. the layer's, ops', reference and registry tests on the GPU again;
#  2. the W8A8-linear rows in one run: bench --cider at M = 512 and 2048 on
#     4096 x 4096 and the four MLP shapes (chains of independent launches, the adaptive
#     chain of at most 32 launches per sample);
#  3. the model: 4 Llama-3-8B layers, prefill at T = 128, 512, 2048 and decode, against
#     bf16 and mlx-lm 8-bit (the shipped table);
#  4. bench --cider with 128 launches per sample on 4096 x 4096 and 14336 x 4096 at
#     M = 512 and 2048: how much of a short chain's time per launch is the sample's fixed
#     cost (evaluation, graph launch, synchronisation).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s19_b}
mkdir -p "$O"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_nn.py tests/test_ops.py \
  tests/test_reference.py tests/test_registry.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -n 2 "$O/tests.log"; grep -E "^(FAILED|ERROR|E  )" "$O/tests.log" | head -20
CS=""
for m in 512 2048; do
  for nk in 4096x4096 14336x4096 4096x14336 18944x3584 3584x18944; do CS="$CS ${m}x$nk"; done
done
timeout 200 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
  --json "$O/cider.jsonl" > "$O/cider.log" 2>&1
echo "cider rc=$?"; grep -v "^{" "$O/cider.log" | tail -n 13
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 \
  --decode 32 --rounds 6 --json "$O/model4.jsonl" > "$O/model4.log" 2>&1
echo "model4 rc=$?"; tail -n 9 "$O/model4.log"
timeout 100 python3 -m mlx_w8a8.bench --cider --shapes 512x4096x4096 2048x4096x4096 \
  512x14336x4096 2048x14336x4096 --pairs 20 --chain 128 \
  --json "$O/cider_chain128.jsonl" > "$O/cider_chain128.log" 2>&1
echo "cider chain 128 rc=$?"; grep -v "^{" "$O/cider_chain128.log" | tail -n 7
# (Step 4 was refused, exit 2: the bench requires at least 30 pairs. It ran in run C.)
