#!/bin/bash
# Device run B, thirtieth set. Tree: branch quantize-one-output as run A, with cffi (and
# pycparser) now on the machine's Python path, so the TMA kernels are offered:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s30_b.sh
# 1) the CUDA tests run A skipped for want of tensor maps (-k tma);
# 2) the shipped table re-measured on the branch (every CUDA candidate's digest changed),
#    as the twenty-eighth set's run F did: M = 1 and 8 with the decode check, then
#    M = 2048 ... 16 with the sibling and prefill checks, keep-choices rule on;
# 3) `bench --cider` with the TMA W8A8 linear forced (as the twenty-ninth set's runs E-F),
#    branch then main's package (tmp_main/: git archive main mlx_w8a8 bench), M = 2048 /
#    512 / 128 on 4096 x 4096 and M = 2048 on the 14336 x 4096 MLP shape.
# Outcome: a first call with 120 s for the tests stopped them at 80%, every test so far
# passing (..._first_try_tests_cuda_tma.log); the second, with 200 s, ran everything
# (445 passed). tune_m16.log did not come back from the machine (the table did).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s30_b}
mkdir -p "$O" tmp_t
python3 -c "from mlx_w8a8.kernels import tensormap; print('tensormap:', tensormap.unavailable() or 'available')"
timeout 200 python3 -m pytest -q -n 12 -p no:cacheprovider -rs -k tma tests/test_cuda.py > "$O/tests_cuda_tma.log" 2>&1
rc=$?; echo "cuda tma tests rc=$rc"; tail -n 2 "$O/tests_cuda_tma.log"; grep -E "^(FAILED|ERROR)" "$O/tests_cuda_tma.log" | head
[ $rc = 0 ] || exit 1
cp mlx_w8a8/tables/nvidia-h200.json tmp_t/branch.json
timeout -s INT 200 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 1,8 --pairs 8 \
  --check-layers 32 --table tmp_t/branch.json --no-progress > "$O/tune_m1.log" 2>&1
echo "tune m1 rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune_m1.log" | tail -6
cp tmp_t/branch.json "$O/branch_m1_nvidia-h200.json"
timeout -s INT 170 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 2048,512,128,64,16 \
  --table tmp_t/branch.json --no-progress > "$O/tune_m16.log" 2>&1
echo "tune m16 rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune_m16.log" | tail -6
cp tmp_t/branch.json "$O/branch_nvidia-h200.json"
CS="2048x4096x4096 512x4096x4096 128x4096x4096 2048x14336x4096"
for v in branch main; do
  d=.; [ $v = main ] && d=tmp_main
  (cd $d && timeout 60 python3 -m mlx_w8a8.bench --cider --shapes $CS --pairs 30 \
    --w8a8-kernel cuda_w8a8_gemm_tma --json "$O/cider_$v.jsonl") > "$O/cider_$v.log" 2>&1
  echo "cider $v rc=$?"; tail -n 5 "$O/cider_$v.log"
done
