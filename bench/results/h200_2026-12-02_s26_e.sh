#!/bin/bash
# Device run E, twenty-sixth set: is the branch's T = 512 deficit (runs B and D) its code
# or its re-measured table? The branch bound-objects on main's table with its digests
# rewritten to the branch's (main's decisions; for this comparison only) against main,
# 32 layers, T = 512 only; tree and .main/ as run B:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s26_e.sh
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s26_e}
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
A="--model llama-3-8b --layers 32 --tokens 512 --decode 0 --rounds 4 --new-lengths --warm-up"
timeout 65 python3 -m mlx_w8a8.bench $A --table tmp_t/branch_restamped.json \
  --json "$O/model32_branch.jsonl" > "$O/model32_branch.log" 2>&1
echo "branch rc=$?"; grep -E "^(prefill|mlx_w8a8.warm_up)" "$O/model32_branch.log"
(cd .main && timeout 65 python3 -m mlx_w8a8.bench $A --json "$O/model32_main.jsonl") \
  > "$O/model32_main.log" 2>&1
echo "main rc=$?"; grep -E "^(prefill|mlx_w8a8.warm_up)" "$O/model32_main.log"
