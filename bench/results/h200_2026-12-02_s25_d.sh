#!/bin/bash
# Device run D, twenty-fifth set (NVIDIA H200, MLX 0.32.4 CUDA build). From branch
# new-length-host, with main's package in .main/ (as run C; carry .main):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s25_d.sh
# Run C: the branch's 32-layer build at new lengths took 20-25% less host time than main's
# in the profiles. Here the 32-layer model, the branch on the shipped table with its
# digests rewritten to the branch's (the same decisions; for this comparison only, the
# branch merges with a re-measured table) and main on its shipped table, each after
# warm_up, prefill at lengths met again and at new lengths, decode.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s25_d}
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
A="--model llama-3-8b --layers 32 --tokens 128,512,2048 --decode 32 --rounds 4 --new-lengths --warm-up"
timeout 210 python3 -m mlx_w8a8.bench $A --table tmp_t/branch_restamped.json \
  --json "$O/model32_branch.jsonl" > "$O/model32_branch.log" 2>&1
echo "branch rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model32_branch.log"
(cd .main && timeout 210 python3 -m mlx_w8a8.bench $A --json "$O/model32_main.jsonl") \
  > "$O/model32_main.log" 2>&1
echo "main rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model32_main.log"
