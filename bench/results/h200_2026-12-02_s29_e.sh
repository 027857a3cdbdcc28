#!/bin/bash
# Device run E, twenty-ninth set. Branch quantize-one-output (9ec0a62: the per-channel
# GEMM's activations as one array, the quantize's only output and the unsigned GEMMs' only
# activation input; shaders/cuda/shape.cuh), with main's package in tmp_main/
# (git archive main mlx_w8a8 bench | tar -x -C tmp_main; run D's script, a second 32-layer
# process of main, was dropped for this run):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s29_e.sh
# 1) every CUDA test on the branch (the kernels' new input and output, every tile forced);
# 2) `bench --cider` with the TMA W8A8 linear forced (the branch's table is stale: every
#    W8A8 digest changed), main then branch, at M = 2048 on 4096 x 4096 and two MLP
#    shapes and at M = 512 and 128 on 4096 x 4096;
# 3) bench/host_split.py at M = 2048, main then branch: Python build, encode, GPU wait.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s29_e}
mkdir -p "$O"
timeout 260 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_cuda.py > "$O/tests_cuda.log" 2>&1
rc=$?; echo "cuda tests rc=$rc"; tail -n 2 "$O/tests_cuda.log"; grep -E "^(FAILED|ERROR)" "$O/tests_cuda.log" | head
[ $rc = 0 ] || exit 1
CS="2048x4096x4096 2048x14336x4096 2048x4096x14336 512x4096x4096 128x4096x4096"
for v in main branch; do
  d=.; [ $v = main ] && d=tmp_main
  (cd $d && timeout 100 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
    --w8a8-kernel cuda_w8a8_gemm_tma --json "$O/cider_$v.jsonl") > "$O/cider_$v.log" 2>&1
  echo "cider $v rc=$?"; tail -n 6 "$O/cider_$v.log"
done
for v in main branch; do
  d=.; [ $v = main ] && d=tmp_main
  (cd $d && timeout 60 python3 bench/host_split.py --m 2048 --chain 40 --rounds 7) > "$O/host_split_$v.log" 2>&1
  echo "host split $v rc=$?"; grep -E "^M=" "$O/host_split_$v.log"
done
