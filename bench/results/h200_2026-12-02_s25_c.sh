#!/bin/bash
# Device run C, twenty-fifth set (NVIDIA H200, MLX 0.32.4 CUDA build). From branch
# new-length-host, with main's package in .main/ (git archive main mlx_w8a8
# bench/new_length_build.py bench/model_host_cost.py | tar -x -C .main; carry .main):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s25_c.sh
# Run A gave the branch's 32-layer build at new lengths 31.2 ms against main's 29.6 (one
# process each); run B gave main 35.5. 1) main and the branch alternating, two processes
# each, both profiled (the branch on the shipped table with its digests rewritten to the
# branch's: the same decisions, for this comparison only), the collector's time counted;
# 2) the 4-layer model of main's final state, after warm_up, with new lengths.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s25_c}
mkdir -p "$O" tmp_t
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
B="--layers 32 --t 129 --count 10 --profile"
for r in 1 2; do
  (cd .main && timeout 70 python3 bench/new_length_build.py $B) > "$O/build32_main$r.log" 2>&1
  echo "main $r rc=$?"; grep -E "^(bf16|mlx_w8a8|collections)" "$O/build32_main$r.log"
  timeout 70 python3 bench/new_length_build.py $B --table tmp_t/branch_restamped.json \
    > "$O/build32_branch$r.log" 2>&1
  echo "branch $r rc=$?"; grep -E "^(bf16|mlx_w8a8|collections)" "$O/build32_branch$r.log"
done
(cd .main && timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 \
  --tokens 128,512,2048 --decode 32 --rounds 6 --new-lengths --warm-up \
  --json "$O/model4.jsonl") > "$O/model4.log" 2>&1
echo "model4 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model4.log"
