#!/bin/bash
# Device run C, twenty-seventh set. Tree: branch tma-rows-on-device, with main's package in
# .main/ (git archive main mlx_w8a8 bench/new_length_build.py bench/model_host_cost.py
# | tar -x -C .main; carry .main):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s27_c.sh
# 1) the 32-layer build at new lengths (30 each), main against the branch on the same
#    decisions (the shipped table with its digests rewritten to the branch's candidates,
#    bench/table_restamp.py): what writing M into the tensor map on the device saves;
# 2) issue 9's per-shape rows on main's final state (not re-measured since the
#    twenty-third set): `python -m mlx_w8a8.bench --cider` at M = 512, 2048, 8192 on
#    4096 x 4096 and the Llama-3-8B / Qwen-7B MLP shapes, and the activation quantize
#    against x.astype(int8) (kernel time, no graphs; the quantize is the same on both trees);
# 3) the 4-layer model on main (issue 9's model rows), --new-lengths --warm-up.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s27_c}
mkdir -p "$O" tmp_t
python3 bench/table_restamp.py mlx_w8a8/tables/nvidia-h200.json tmp_t/restamped.json
B="--layers 32 --t 129 --count 30"
(cd .main && timeout 80 python3 bench/new_length_build.py $B) > "$O/build32_main.log" 2>&1
echo "main rc=$?"; grep -E "^(bf16|mlx_w8a8|collections)|objects tracked" "$O/build32_main.log"
timeout 80 python3 bench/new_length_build.py $B --table tmp_t/restamped.json > "$O/build32_branch.log" 2>&1
echo "branch rc=$?"; grep -E "^(bf16|mlx_w8a8|collections)|objects tracked" "$O/build32_branch.log"
CS=""
for m in 512 2048 8192; do
  for nk in 4096x4096 14336x4096 4096x14336 18944x3584 3584x18944; do CS="$CS ${m}x$nk"; done
done
(cd .main && timeout 230 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
  --json "$O/cider.jsonl") > "$O/cider.log" 2>&1
echo "cider rc=$?"; tail -n 20 "$O/cider.log"
MLX_USE_CUDA_GRAPHS=0 timeout 50 python3 bench/chain_timeline.py --quantize --m 512,2048,8192 \
  --kn 4096x1,14336x1 --chain 40 > "$O/quant_nographs.log" 2>&1
echo "quant rc=$?"; grep -E "^(M=|MLX)" "$O/quant_nographs.log"
python3 -c "import sys; sys.path.insert(0, 'bench'); import cuda_bench; print(f'torch copy bandwidth {cuda_bench.copy_bandwidth() / 1e9:.0f} GB/s (read + written)')"
A="--model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 --rounds 6 --new-lengths --warm-up"
(cd .main && timeout 100 python3 -m mlx_w8a8.bench $A --json "$O/model4_main.jsonl") > "$O/model4_main.log" 2>&1
echo "model4 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model4_main.log"
