#!/bin/bash
# Device run G, thirty-second set: a mutant for the new GPU test. Tree: main after the
# merge (0206958) in tmp_mut/ (git archive mlx_w8a8 tests) with one change: the
# per-channel TMA bodies write A's map into the weight's map array (grown to 768 bytes)
# instead of the activation array's map area, so launches on one weight and different
# activation arrays that run at once write different maps into one place.
# test_tma_launches_that_run_at_once_write_the_same_maps should fail on it; the other
# TMA linear tests, whose launches run one at a time, may pass:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s32_g.sh
# Outcome: the call ran out of its 150 s (a fresh process compiles every kernel of the
# mutant's text) after 13 of the 15 selected tests: 7 failed, 6 passed. The log names no
# test (pytest stopped before its summary). Of the 15, six layout cases run a TMA GEMM and
# check the map area, which the mutant leaves zero; so at least one of the 7 failures is
# among the five other tests (the concurrency test's two, the host-read test's three),
# which of them is not recorded.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s32_g}
mkdir -p "$O"
grep -n "MUTANT" tmp_mut/mlx_w8a8/shaders/cuda/gemm_ws.cu tmp_mut/mlx_w8a8/kernels/cuda_launch.py
(cd tmp_mut && PYTHONPATH=$PWD:$PYTHONPATH timeout 150 python3 -m pytest -q -p no:cacheprovider -rs \
  tests/test_cuda.py -k "run_at_once or after_the_host_read or rowsum_array_layout" -n 6) \
  > "$O/mutant_tests.log" 2>&1
echo "mutant tests rc=$?"; tail -n 3 "$O/mutant_tests.log"; grep -E "^(FAILED|ERROR)" "$O/mutant_tests.log" | head -20
