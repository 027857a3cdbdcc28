#!/bin/bash
# Device run B, twenty-fifth set (NVIDIA H200, MLX 0.32.4 CUDA build), main's tree:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s25_b.sh
# Run A's profile of the 32-layer build at new lengths charged 225 of 392 ms to a
# function whose own code only makes a closure: the collector's time, presumably.
# 1) the 32-layer build at new lengths with the collector's time counted (gc.callbacks),
#    then with gc.freeze() after loading;
# 2) the 32-layer model of main's final state (decisions kept, siblings planned together,
#    warm_up), prefill at lengths met again and at new lengths, decode, after warm_up.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s25_b}
mkdir -p "$O"
for f in "" --gc-freeze; do
  timeout 80 python3 bench/new_length_build.py --layers 32 --t 129 --count 10 $f \
    > "$O/build32${f:+_freeze}.log" 2>&1
  echo "build $f rc=$?"; grep -vE "^ *$" "$O/build32${f:+_freeze}.log" | tail -6
done
timeout 340 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 128,512,2048 \
  --decode 32 --rounds 4 --new-lengths --warm-up --json "$O/model32.jsonl" > "$O/model32.log" 2>&1
echo "model32 rc=$?"; grep -E "^(prefill|decode|mlx_w8a8.warm_up|warm)" "$O/model32.log"
