#!/bin/bash
# Device run B, twenty-seventh set. Branch tma-rows-on-device (the TMA
# GEMM writes each launch's M and A's box rows into A's tensor map on the device, so the
# prototypes are made once per K and a new prompt length encodes none; kernel and
# launcher changed, so the TMA candidates' digests differ and the shipped table is stale
# here), with main's package in .main/ (git archive main mlx_w8a8
# bench/new_length_build.py bench/model_host_cost.py | tar -x -C .main; carry .main):
# and main before the plan change (6a2442b) in .base/ (the same archive of 6a2442b; carry
# .base). Run A's script (on main) was folded into this one: the branch's CUDA suite covers
# main's changes too (the branch is main plus the TMA maps), and its model rows are here.
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s27_b.sh [test|tune|model]
# test: every CUDA test on the branch (tests/test_cuda.py's
#       test_tma_activation_map_takes_each_launchs_rows is new: one prototype, M = 300, 1,
#       77, 128, 129, 2 against the oracle), then M = 1 and 8 of the table re-measured on the
#       branch into tmp_t/branch.json from the shipped table (its choices are kept unless
#       beaten by the margin: tune's keep-choices rule), with the decode check;
# tune: M = 2048 ... 16 re-measured into the same table with the sibling and prefill
#       checks, then the 32-layer build at new lengths (30 each), base
#       against main, the collector's time and collections per generation (twenty-sixth
#       set run C: base 261-299 ms of collection per 10 builds, one full collection);
# model: the 32-layer model, main, branch, base, branch, main (the branch on
#       tmp_t/branch.json), --new-lengths --warm-up.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s27_b}
mkdir -p "$O" tmp_t
case "${1:-test}" in
  test)
    # The changed maps first, briefly: a box the kernel's byte count disagrees with hangs
    # its barrier rather than failing.
    timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py \
      -k "activation_map or tma_producer" > "$O/tests_tma.log" 2>&1
    rc=$?; echo "tma tests rc=$rc"; tail -n 2 "$O/tests_tma.log"
    [ $rc = 0 ] || exit 1
    timeout 260 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_cuda.py > "$O/tests_cuda.log" 2>&1
    rc=$?; echo "cuda tests rc=$rc"; tail -n 2 "$O/tests_cuda.log"; grep -E "^(FAILED|ERROR)" "$O/tests_cuda.log" | head
    [ $rc = 0 ] || exit 1
    cp mlx_w8a8/tables/nvidia-h200.json tmp_t/branch.json
    timeout -s INT 200 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 1,8 --pairs 8 \
      --check-layers 32 --table tmp_t/branch.json --no-progress > "$O/tune_m1.log" 2>&1
    echo "tune m1 rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune_m1.log" | tail -8
    cp tmp_t/branch.json "$O/branch_m1_nvidia-h200.json";;
  tune)
    timeout -s INT 300 python3 -m mlx_w8a8.tune --model llama-3-8b --force --m 2048,512,128,64,16 \
      --table tmp_t/branch.json --no-progress > "$O/tune_m16.log" 2>&1
    echo "tune m16 rc=$?"; grep -vE "^[0-9]+ +[0-9]+ |^--|^M " "$O/tune_m16.log" | tail -8
    cp tmp_t/branch.json "$O/branch_nvidia-h200.json"
    B="--layers 32 --t 129 --count 30"
    for v in base main; do
      (cd .$v && timeout 100 python3 bench/new_length_build.py $B) > "$O/build32_$v.log" 2>&1
      echo "$v rc=$?"; grep -E "^(bf16|mlx_w8a8|collections)|objects tracked" "$O/build32_$v.log"
    done;;
  model)
    A="--model llama-3-8b --layers 32 --tokens 128,512,2048 --decode 32 --rounds 4 --new-lengths --warm-up"
    for v in main branch base branch2 main2; do
      case $v in base*) d=.base; t="";; main*) d=.main; t="";; *) d=.; t="--table tmp_t/branch.json";; esac
      (cd $d && timeout 110 python3 -m mlx_w8a8.bench $A $t --json "$O/model32_$v.jsonl") > "$O/model32_$v.log" 2>&1
      echo "$v rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up)" "$O/model32_$v.log"
    done;;
esac
