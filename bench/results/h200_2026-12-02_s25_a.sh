#!/bin/bash
# Device run A, twenty-fifth set (NVIDIA H200, MLX 0.32.4 CUDA build). From branch
# new-length-host (direct first calls, a spec's compiled launch made on its second call,
# launch frames shared by every layer of one shape), with main's package in .main/:
#   git archive main mlx_w8a8 bench/new_length_build.py bench/model_host_cost.py | tar -x -C .main
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s25_a.sh
# 1) every CUDA test on the branch (the changed launch path's exactness); stop if one fails;
# 2) the 32-layer graph build at a new length, main (shipped table) against the branch on a
#    copy of the shipped table with its digests rewritten to the branch's (the same
#    decisions; for this comparison only), the branch profiled;
# 3) re-measure the M = 1 and 8 buckets of Llama-3-8B into tmp_t/branch.json (the branch
#    changed candidate code, so every CUDA digest differs), with the decode check on all
#    32 layers. Run B re-measures M = 16 ... 2048 into the same copy.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s25_a}
mkdir -p "$O" tmp_t
timeout 260 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda.py > "$O/tests_cuda.log" 2>&1
rc=$?; echo "cuda tests rc=$rc"; tail -n 2 "$O/tests_cuda.log"; grep -E "^(FAILED|ERROR)" "$O/tests_cuda.log" | head
[ $rc = 0 ] || exit 1
python3 - <<'PY'
import json
from mlx_w8a8.kernels import registry
d = json.load(open("mlx_w8a8/tables/nvidia-h200.json"))
for sec in d["sections"]:
    for e in sec["entries"]:
        for name, c in e["candidates"].items():
            cand = registry.find(e["op"], name)
            if cand is not None:
                c["digest"] = cand.digest
json.dump(d, open("tmp_t/branch_restamped.json", "w"), indent=1)
PY
(cd .main && timeout 70 python3 bench/new_length_build.py --layers 32 --t 129 --count 6) \
  > "$O/build32_main.log" 2>&1
echo "main rc=$?"; grep -E "^(bf16|mlx_w8a8)" "$O/build32_main.log"
timeout 70 python3 bench/new_length_build.py --layers 32 --t 129 --count 6 --profile \
  --table tmp_t/branch_restamped.json > "$O/build32_branch.log" 2>&1
echo "branch rc=$?"; grep -E "^(bf16|mlx_w8a8)" "$O/build32_branch.log"
cp mlx_w8a8/tables/nvidia-h200.json tmp_t/branch.json
timeout -s INT 190 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 1,8 --pairs 8 \
  --check-layers 32 --table tmp_t/branch.json --no-progress > "$O/tune_m1.log" 2>&1
echo "tune rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune_m1.log" | tail -20
cp tmp_t/branch.json "$O/branch_m1.json"
