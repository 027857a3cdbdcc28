#!/bin/bash
# Device run D, twenty-seventh set: run C's build comparison again in alternating order
# (run C's branch process ran every build, bf16's too, about 35% faster than main's before
# it). Tree and .main as run C:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s27_d.sh
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s27_d}
mkdir -p "$O" tmp_t
python3 bench/table_restamp.py mlx_w8a8/tables/nvidia-h200.json tmp_t/restamped.json
B="--layers 32 --t 129 --count 30"
for r in 1 2; do
  timeout 70 python3 bench/new_length_build.py $B --table tmp_t/restamped.json > "$O/build32_branch$r.log" 2>&1
  echo "branch $r rc=$?"; grep -E "^(bf16|mlx_w8a8) +new" "$O/build32_branch$r.log"
  (cd .main && timeout 70 python3 bench/new_length_build.py $B) > "$O/build32_main$r.log" 2>&1
  echo "main $r rc=$?"; grep -E "^(bf16|mlx_w8a8) +new" "$O/build32_main$r.log"
done
