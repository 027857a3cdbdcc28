#!/bin/bash
# Device run D, twenty-fourth set (2026-12-02; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s24_d.sh
# Ran main ecce481 (its working tree: bench/new_length_build.py and the warm_up work, then
# uncommitted; warm_up adds Candidate.variant, which no call reads), and .dfc/ holding
# branch direct-first-call's package (git archive direct-first-call mlx_w8a8) with the
# same script. Run B put the W8A8 model's graph build at a length not met before at 6-13
# ms for 4 layers against 0.3-0.9 for bf16. Here: the median build at 20 new lengths
# (T = 131..150, after warming up at 129 and 130 so nothing compiles) and where it goes
# (cProfile), 1) main with the shipped table, 2) main forced to the TMA GEMM, 3) the
# branch forced to the TMA GEMM (its table is stale, so both forced).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s24_d}
mkdir -p "$O/d"
timeout 120 python3 bench/new_length_build.py --layers 4 --t 129 --count 20 --profile \
  > "$O/d/build_shipped.log" 2>&1
echo "shipped rc=$?"; head -4 "$O/d/build_shipped.log"
timeout 100 python3 bench/new_length_build.py --layers 4 --t 129 --count 20 \
  --kernel cuda_w8a8_gemm_tma > "$O/d/build_tma_main.log" 2>&1
echo "tma main rc=$?"; head -4 "$O/d/build_tma_main.log"
(cd .dfc && timeout 100 python3 bench/new_length_build.py --layers 4 --t 129 --count 20 \
  --kernel cuda_w8a8_gemm_tma --profile) > "$O/d/build_tma_branch.log" 2>&1
echo "tma branch rc=$?"; head -4 "$O/d/build_tma_branch.log"
tar -C "$O" -czf "$O/s24_d.tgz" d && rm -rf "$O/d"
