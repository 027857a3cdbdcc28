#!/bin/bash
# Device run A, twenty-sixth set (written in the twenty-fifth set's session, run in the
# twenty-sixth's; its py-spy step wrote nothing: at 250 Hz --native fell 10 s behind and
# `timeout`'s TERM stopped it before it wrote; run C repeats it at 50 Hz). Main after the merge of new-length-host and the digest
# rule that leaves out Python comments and docstrings:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s26_a.sh
# 1) the shipped table is fresh on the device (its digest fields were re-computed on the
#    CPU for the unchanged code; expect "cuda_w8a8_gemm_tma table": a stale table's warning,
#    raised as an error here, makes the tuner fall back) and the 4-layer model as shipped,
#    with new lengths, after warm_up (the README's 4-layer column is from before the merge);
# 2) a native sampling profile of the 32-layer build at new lengths (py-spy 0.4.3 beside
#    the carried MLX build), summarized within the model's call in the W8A8 and the bf16 new-length builds:
#    where the 22-29 ms per build that the layers cost goes, MLX's C++ included.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s26_a}
mkdir -p "$O"
python3 -c "
import warnings
import mlx_w8a8
warnings.simplefilter('error', mlx_w8a8.TuningTableWarning)
from mlx_w8a8.kernels import registry
p = registry.Problem('linear', 2048, 14336, 4096, 'bfloat16', 'per_channel', 64, False)
c, source = registry.decide(p)
print('M = 2048, gate/up:', c.name, source)
" > "$O/fresh.log" 2>&1
echo "fresh rc=$?"; cat "$O/fresh.log"
timeout 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 128,512,2048 \
  --decode 32 --rounds 6 --new-lengths --warm-up --json "$O/model4.jsonl" > "$O/model4.log" 2>&1
echo "model4 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)|Warning" "$O/model4.log"
SPY=$(dirname "$(python3 -c 'import mlx_lm, os; print(os.path.dirname(mlx_lm.__file__))')")/py-spy
timeout 200 "$SPY" record --native -r 250 -f raw -o "$O/spy_build32.txt" -- \
  python3 bench/new_length_build.py --layers 32 --t 129 --count 60 > "$O/spy_build32.log" 2>&1
echo "spy rc=$?"; grep -E "^(bf16|mlx_w8a8|collections)" "$O/spy_build32.log"
for v in mlx_w8a8 bf16; do
  python3 bench/spy_summary.py "$O/spy_build32.txt" --within _build_$v --within Model.__call__ \
    --by-function --top 60 > "$O/spy_build32_$v.txt"
  head -45 "$O/spy_build32_$v.txt"
done
