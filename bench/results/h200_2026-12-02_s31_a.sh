#!/bin/bash
# Device run A, thirty-first set. Tree: branch tma-ready-maps (the TMA GEMM's maps made
# ahead: A's by the quantize into the activation array, each weight's once per weight and
# tile width; no scratch output; not merged: its code is
# h200_2026-12-02_s31_tma_ready_maps.patch against main at c9d162d, the tma_touch load
# below since removed), with main's package (git archive main mlx_w8a8 bench) in tmp_main/
# for the paired bench:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s31_a.sh
# 1) tests/test_cuda.py whole (every quantize body changed its array's layout);
# Outcome of the first call (tree ec16a9b): 6 of 450 failed, all test_rowsum_array_layout's
# TMA check after numpy had read the array; the second call, on the tree with tma_touch
# (an acquire load of each ready map first), failed 4 (the same test), so the script
# stopped before step 2: no bench ran.
# 2) `bench --cider` with the TMA W8A8 linear forced, branch then main, M = 2048 / 512 /
#    128 on 4096 x 4096 and M = 2048 on the 14336 x 4096 MLP shape (as the thirtieth
#    set's run B).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s31_a}
mkdir -p "$O"
python3 -c "from mlx_w8a8.kernels import tensormap; print('tensormap:', tensormap.unavailable() or 'available')"
timeout 280 python3 -m pytest -q -n 12 -p no:cacheprovider -rs tests/test_cuda.py > "$O/tests_cuda.log" 2>&1
rc=$?; echo "cuda tests rc=$rc"; tail -n 2 "$O/tests_cuda.log"; grep -E "^(FAILED|ERROR)" "$O/tests_cuda.log" | head
[ $rc = 0 ] || exit 1
CS="2048x4096x4096 512x4096x4096 128x4096x4096 2048x14336x4096"
for v in branch main; do
  d=.; [ $v = main ] && d=tmp_main
  (cd $d && timeout 60 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
    --w8a8-kernel cuda_w8a8_gemm_tma --json "$O/cider_$v.jsonl") >> "$O/cider_$v.log" 2>&1
  echo "cider $v rc=$?"; tail -n 5 "$O/cider_$v.log"
done
