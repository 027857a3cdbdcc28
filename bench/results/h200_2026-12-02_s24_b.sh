#!/bin/bash
# Device run B, twenty-fourth set (2026-12-02; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s24_b.sh
# Ran main with bench/first_call.py added. Run A's --new-lengths rows showed the first
# prefill at a new length costing the W8A8 model 1.6-7.8 s in every process (bf16: 0.06-0.9 s),
# and each later new length 50-90 ms in all three variants. Here: where that time goes,
# per variant, build vs eval, and whether MLX's on-disk kernel cache fills: 1) forced to
# the TMA GEMM, twice (the second process finds the first's cache); 2) the shipped
# table, twice.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s24_b}
mkdir -p "$O/b"
L=128,129,130,512,515,516,2048,2051,2052
for r in tma1 tma2 shipped1 shipped2; do
  k=""; case $r in tma*) k="--kernel cuda_w8a8_gemm_tma";; esac
  timeout 100 python3 bench/first_call.py --layers 4 --lengths $L --profile $k \
    --out "$O/b/first_$r.jsonl" > "$O/b/first_$r.log" 2>&1
  echo "first_call $r rc=$?"; grep -E "^(bf16|mlx_w8a8|llama)" "$O/b/first_$r.log"
done
tar -C "$O" -czf "$O/s24_b.tgz" b && rm -rf "$O/b"
