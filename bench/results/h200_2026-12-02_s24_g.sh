#!/bin/bash
# Device run G, twenty-fourth set: written, NOT RUN (no device time was left). From branch
# new-length-host (direct first calls, compiled launches made on a spec's second call,
# launch frames shared by every layer of one shape), with main's package in .main/
# (git archive main mlx_w8a8 | tar -x -C .main; cp bench/new_length_build.py .main/bench/;
# carry .main):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s24_g.sh
# 1) every CUDA test on the branch (exactness of the changed launch path);
# 2) the graph build at new lengths, main (shipped table) against the branch on a copy of
#    the shipped table whose digests are rewritten to the branch's here (the same
#    decisions; for this comparison only), 4 and 32 layers, the branch profiled.
# Then, if both hold: re-measure the table on the branch (tune --model llama-3-8b --force,
# M = 16-2048, then M = 1, 8 with the decode check), and A/B the 32-layer model with
# --new-lengths against main before merging.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s24_g}
mkdir -p "$O" tmp_t
timeout 300 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda.py > "$O/tests_cuda.log" 2>&1
echo "cuda tests rc=$?"; tail -n 2 "$O/tests_cuda.log"; grep -E "^(FAILED|ERROR)" "$O/tests_cuda.log" | head
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
for layers in 4 32; do
  (cd .main && timeout 90 python3 bench/new_length_build.py --layers $layers --t 129 --count 10) \
    > "$O/build${layers}_main.log" 2>&1
  echo "main $layers rc=$?"; grep -E "^(bf16|mlx_w8a8)" "$O/build${layers}_main.log"
  timeout 90 python3 bench/new_length_build.py --layers $layers --t 129 --count 10 --profile \
    --table tmp_t/branch_restamped.json > "$O/build${layers}_branch.log" 2>&1
  echo "branch $layers rc=$?"; grep -E "^(bf16|mlx_w8a8)" "$O/build${layers}_branch.log"
done
