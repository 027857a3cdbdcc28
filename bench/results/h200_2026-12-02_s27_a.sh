#!/bin/bash
# Device run A, twenty-seventh set: written, NOT RUN (no device time was left in the
# twenty-sixth set's session). Main with branch second-meeting merged (a layer keeps a
# plan from its second call at an input shape), against main before it (6a2442b) in
# .base/ (git archive 6a2442b mlx_w8a8 bench/new_length_build.py bench/model_host_cost.py
# | tar -x -C .base; carry .base). nn.py is digest-free: both run the shipped table.
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s27_a.sh [test|model]
# test:  every CUDA test, then the 32-layer build at new lengths (30 each), base and main
#        alternating twice: build medians, the collector's time and collections per
#        generation (run C of the twenty-sixth set: base 261-299 ms and one full
#        collection per 10 builds).
# model: the 32-layer model with --new-lengths --warm-up, base, main, main, base.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s27_a}
mkdir -p "$O"
case "${1:-test}" in
  test)
    timeout 260 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_cuda.py > "$O/tests_cuda.log" 2>&1
    rc=$?; echo "cuda tests rc=$rc"; tail -n 2 "$O/tests_cuda.log"; grep -E "^(FAILED|ERROR)" "$O/tests_cuda.log" | head
    [ $rc = 0 ] || exit 1
    B="--layers 32 --t 129 --count 30"
    for r in 1 2; do
      (cd .base && timeout 100 python3 bench/new_length_build.py $B) > "$O/build32_base$r.log" 2>&1
      echo "base $r rc=$?"; grep -E "^(bf16|mlx_w8a8|collections)|objects tracked" "$O/build32_base$r.log"
      timeout 100 python3 bench/new_length_build.py $B > "$O/build32_main$r.log" 2>&1
      echo "main $r rc=$?"; grep -E "^(bf16|mlx_w8a8|collections)|objects tracked" "$O/build32_main$r.log"
    done;;
  model)
    A="--model llama-3-8b --layers 32 --tokens 128,512,2048 --decode 32 --rounds 4 --new-lengths --warm-up"
    for v in base main main2 base2; do
      d=$([ "${v#base}" != "$v" ] && echo .base || echo .)
      (cd $d && timeout 110 python3 -m mlx_w8a8.bench $A --json "$O/model32_$v.jsonl") > "$O/model32_$v.log" 2>&1
      echo "$v rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model32_$v.log"
    done;;
esac
