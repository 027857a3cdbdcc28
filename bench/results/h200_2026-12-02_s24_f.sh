#!/bin/bash
# Device run F, twenty-fourth set (2026-12-02; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s24_f.sh
# Ran from branch new-length-host (main with direct-first-call's two commits and the
# compiled launch made on a spec's second call), with .main/ holding main's package
# (git archive main mlx_w8a8, + bench/new_length_build.py) and tmp_t/branch_restamped.json,
# an untracked copy of the shipped table whose digests were rewritten to the branch's
# (the same decisions; for this host-cost comparison only, never shipped: the branch
# changes candidate code, so its table must be re-measured). 1) the 4-layer graph build
# at 20 new lengths, main with the shipped table and the branch with that copy, and main
# after gc.freeze(); 2) the branch's bound-launch, layer and sibling tests on the GPU;
# 3) the same build with 32 layers, 6 new lengths, main and branch. Logs are written as
# they finish (a run cut short keeps what it made).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s24_f}
mkdir -p "$O"
B="--layers 4 --t 129 --count 20"
(cd .main && timeout 70 python3 bench/new_length_build.py $B) > "$O/build_main_gcoff.log" 2>&1
echo "main rc=$?"; head -3 "$O/build_main_gcoff.log"
timeout 70 python3 bench/new_length_build.py $B --table tmp_t/branch_restamped.json \
  > "$O/build_branch_gcoff.log" 2>&1
echo "branch rc=$?"; head -3 "$O/build_branch_gcoff.log"
(cd .main && timeout 70 python3 bench/new_length_build.py $B --gc-freeze) > "$O/build_main_gcon.log" 2>&1
echo "main gc.freeze rc=$?"; head -3 "$O/build_main_gcon.log"
timeout 90 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda.py -k \
  "bound or sibling or stages or siblings or tma_producer or interchangeable" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -n 2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head
(cd .main && timeout 80 python3 bench/new_length_build.py --layers 32 --t 129 --count 6) \
  > "$O/build32_main.log" 2>&1
echo "32 layers main rc=$?"; head -3 "$O/build32_main.log"
timeout 80 python3 bench/new_length_build.py --layers 32 --t 129 --count 6 \
  --table tmp_t/branch_restamped.json > "$O/build32_branch.log" 2>&1
echo "32 layers branch rc=$?"; head -3 "$O/build32_branch.log"
