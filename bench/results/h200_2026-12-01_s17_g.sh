#!/bin/bash
# Device run G, seventeenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s17_g.sh
# Ran main at commit e55a26f with tmp_t/candidate.json (run E's table). Run F again in
# the other order (candidate first) at T = 16, 128, 512, 6 rounds; then the candidate on
# 4 layers as the README's model table measures it; then every CUDA test with the
# candidate in place of the shipped table (cp over mlx_w8a8/tables/nvidia-h200.json in
# this copy of the tree).
# (tmp_t/ was an untracked copy, deleted after the set; its file is ..._s17_e_nvidia-h200.json,
# shipped since as mlx_w8a8/tables/nvidia-h200.json.)
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s17_g}
mkdir -p "$O"
for tab in candidate shipped; do
  arg=""; [ $tab = candidate ] && arg="--table tmp_t/candidate.json"
  timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 16,128,512 \
    --decode 0 --rounds 6 $arg --json "$O/model32_$tab.jsonl" > "$O/model32_$tab.log" 2>&1
  echo "model32 $tab rc=$?"; tail -n 5 "$O/model32_$tab.log" | head -3
done
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 16,32,128,512,2048 \
  --decode 32 --rounds 10 --table tmp_t/candidate.json --json "$O/model4.jsonl" > "$O/model4.log" 2>&1
echo "model4 rc=$?"; tail -n 8 "$O/model4.log"
cp tmp_t/candidate.json mlx_w8a8/tables/nvidia-h200.json
timeout 330 python3 -m pytest -q -n 4 tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head
