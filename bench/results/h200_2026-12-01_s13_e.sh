#!/bin/bash
# Device run E, thirteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s13_e.sh
# The one-launch small-M GEMM (cuda_w8a8_gemm_fused, gemm_fq.cu): its CUDA tests (and the
# tests that cover every linear candidate); if they pass, the shipped table re-measured at
# M = 1, 8, 16 (the new candidate stales those entries) with the decode, sibling and
# prefill checks, then the 4-layer model at T = 16, 32, 128 and decode on that table.
# The kernel it tests is on the branch fused-small-m (commit 7350029; not on main: it won
# no race it entered, thirteenth set in docs/cuda.md); run this script there.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s13_e}
mkdir -p "$O"
timeout 200 python3 -m pytest -q -n 4 tests/test_cuda.py \
  -k "fused or gate_accepts or bound_launches or siblings_run or stages_equal" > "$O/tests.log" 2>&1
rc=$?
echo "tests rc=$rc"; tail -3 "$O/tests.log"; grep -E "^FAILED|^ERROR" "$O/tests.log" | head -20
if [ $rc -ne 0 ]; then grep -E "^E " "$O/tests.log" | head -30; exit 1; fi
T="$O/nvidia-h200.json"
cp mlx_w8a8/tables/nvidia-h200.json "$T"
timeout -s INT 220 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,8,16 --pairs 8 \
  --force --table "$T" --no-progress > "$O/tune.log" 2>&1
echo "tune rc=$?"; grep -E "^ *(1|8|16) " "$O/tune.log" | cut -c1-300
grep -iE -A12 "check \(|interrupted|problem\(s\) in" "$O/tune.log" | cut -c1-220 | head -45
timeout 110 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 16,32,128 --decode 32 \
  --rounds 6 --table "$T" --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model rc=$?"; tail -7 "$O/model.log"
