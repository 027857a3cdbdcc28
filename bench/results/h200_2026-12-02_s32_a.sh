#!/bin/bash
# Device run A, thirty-second set. Tree: branch tma-own-maps (the TMA GEMM without its
# scratch output: every launch writes A's tensor map into the activation array's map area
# and each weight's into the weight's map array, both inputs; the activation array 256
# bytes longer), with main's package (git archive main mlx_w8a8 tests bench/host_split.py)
# in tmp_main/:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s32_a.sh
# 1) tests/test_cuda.py whole (every unsigned GEMM reads the longer array);
# 2) `bench --cider` with the TMA W8A8 linear forced (no table needed), branch, main,
#    branch: M = 2048 and 512 on 4096 x 4096, M = 2048 on 14336 x 4096;
# 3) main's new test of the TMA linear after the host read its operands (never run on
#    the GPU before).
# Outcome: 453 of 453 CUDA tests passed (198 s); `bench --cider`, TMA forced, 4096 x 4096 at
# M = 2048: branch 1.39x, main 1.33x, branch 1.44x bf16; main's host-read test 3 of 3.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s32_a}
mkdir -p "$O"
python3 -c "from mlx_w8a8.kernels import tensormap; print('tensormap:', tensormap.unavailable() or 'available')"
timeout 250 python3 -m pytest -q -n 12 -p no:cacheprovider -rs tests/test_cuda.py > "$O/tests_cuda.log" 2>&1
rc=$?; echo "cuda tests rc=$rc"; tail -n 2 "$O/tests_cuda.log"; grep -E "^(FAILED|ERROR)" "$O/tests_cuda.log" | head
[ $rc = 0 ] || exit 1
CS="2048x4096x4096 512x4096x4096 2048x14336x4096"
for v in branch main branch2; do
  d=.; [ $v = main ] && d=tmp_main
  (cd $d && timeout 60 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
    --w8a8-kernel cuda_w8a8_gemm_tma --json "$O/cider_$v.jsonl") > "$O/cider_$v.log" 2>&1
  echo "cider $v rc=$?"; tail -n 4 "$O/cider_$v.log"
done
(cd tmp_main && timeout 90 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py \
  -k host_read) > "$O/main_host_read_test.log" 2>&1
echo "main host-read test rc=$?"; tail -n 2 "$O/main_host_read_test.log"
