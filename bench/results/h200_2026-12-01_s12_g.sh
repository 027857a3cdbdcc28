#!/bin/bash
# Device run G, twelfth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s12_g.sh
# The final tree (commit 9e04205: digests over the compiled kernel text, the shipped
# table's digest fields re-computed): the shipped table decides on the GPU machine
# (every Llama-3-8B prefill entry fresh, no stale-table warning); every CUDA test; the
# 4-layer model on the shipped table, 10 rounds.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s12_g}
mkdir -p "$O"
python3 - <<'PY' 2>&1 | tee "$O/fresh.log"
import warnings
warnings.simplefilter("error")
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Problem
n = 0
for m in (1, 8, 128, 512, 2048):
    for nn, k in ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (6144, 4096),
                  (28672, 4096), (128256, 4096)):
        cand, source = registry.decide(Problem("linear", m, nn, k, "bfloat16", "per_channel", 64))
        assert source == "table", (m, nn, k, cand.name, source)
        n += 1
print(f"{n} shipped-table decisions, all from the table, no warning")
PY
N=""
python3 -c "import xdist" 2>/dev/null && N="-n 4"
timeout 280 python3 -m pytest -q -p no:cacheprovider $N tests/test_cuda.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
timeout 110 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 --decode 32 \
  --rounds 10 --json "$O/model.jsonl" > "$O/model.log" 2>&1
echo "model bench rc=$?"; tail -8 "$O/model.log"
