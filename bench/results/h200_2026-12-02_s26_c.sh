#!/bin/bash
# Device run C, twenty-sixth set. Run A's native profile stopped with nothing written:
# py-spy --native at 250 Hz fell 10 s behind (every sample stops the process to unwind
# MLX's threads) and `timeout`'s TERM killed it before it wrote. Here: 50 Hz, SIGINT (py-spy
# writes its profile on INT), 30 new lengths. Tree: branch bound-objects, with main's
# package in .main/ (git archive main mlx_w8a8 bench/new_length_build.py
# bench/model_host_cost.py bench/spy_summary.py | tar -x -C .main; carry .main):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s26_c.sh
# 1) the native profile of main's 32-layer build at new lengths, summarized within the
#    model's call in the W8A8 and the bf16 builds;
# 2) the 32-layer build at new lengths, main against the branch, two alternating pairs
#    (the branch on the shipped table with its digests rewritten to the branch's: the
#    same decisions, for this comparison only), the collector's time counted.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s26_c}
mkdir -p "$O" tmp_t
SPY=$(dirname "$(python3 -c 'import mlx_lm, os; print(os.path.dirname(mlx_lm.__file__))')")/py-spy
(cd .main && timeout -s INT 170 "$SPY" record --native -r 50 -f raw -o "$O/spy_build32.txt" -- \
  python3 bench/new_length_build.py --layers 32 --t 129 --count 30) > "$O/spy_build32.log" 2>&1
echo "spy rc=$?"; grep -E "^(bf16|mlx_w8a8|collections)" "$O/spy_build32.log"; grep -c behind "$O/spy_build32.log"
for v in mlx_w8a8 bf16; do
  python3 bench/spy_summary.py "$O/spy_build32.txt" --within _build_$v --within Model.__call__ \
    --by-function --top 60 > "$O/spy_build32_$v.txt"
  head -40 "$O/spy_build32_$v.txt"
done
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
B="--layers 32 --t 129 --count 10"
for r in 1 2; do
  (cd .main && timeout 70 python3 bench/new_length_build.py $B) > "$O/build32_main$r.log" 2>&1
  echo "main $r rc=$?"; grep -E "^(bf16|mlx_w8a8|collections)" "$O/build32_main$r.log"
  timeout 70 python3 bench/new_length_build.py $B --table tmp_t/branch_restamped.json \
    > "$O/build32_branch$r.log" 2>&1
  echo "branch $r rc=$?"; grep -E "^(bf16|mlx_w8a8|collections)" "$O/build32_branch$r.log"
done
