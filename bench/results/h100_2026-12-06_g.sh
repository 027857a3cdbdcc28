#!/bin/bash
# Device runs G, 2026-12-06: the subnormal GEMM's promotion loads and its small-M use.
# Every part appends to g.log (kept as h100_2026-12-06_g.log); each part's header line
# names its GPU and tree:
#   . .device-mlx/mlx-env.sh && OUT=<dir> TREE=<commit> DEADLINE=<s> bash bench/results/h100_2026-12-06_g.sh <parts>
# Part LDS: the subnormal GEMM's exactness tests (tests/test_cuda.py -k subnormal) with
# the terms' S stored in the order that gives each thread its four values of two
# accumulator blocks in one 16-byte load (8-bit codes; the 4-bit bodies take two 8-byte
# loads of the same order); kernel times (tile_gpu_time --sub) against the same kernel
# with two 8-byte loads for 8-bit codes too (<tile>+: exp/lds64, the package's
# gemm_grouped_ws.cu with subnormal_tile's WIDE argument false), at prefill and small M.
# Part R16: the group-wise 8-bit race at small M with the subnormal GEMM among the
# candidates (tune --format grouped --group-size 64 --m 16,32,64, its checks off), then
# the 4-layer bench's batched decode at B = 16 from the mlx-lm 8-bit gs64 checkpoint on
# the default path (no table) and with that race's table.
# Part NCU: the per-channel TMA GEMM's 256- and 128-wide tiles on part LDS's shapes (the
# 128 x 128 tile's time without groups), then Nsight Compute on the package's 128-wide
# subnormal tile at M = 2048 (4096 x 14336), summarized by bench/ncu_summary.py.
# Part QMM: mx.quantized_matmul (8-bit, gs64, bfloat16) at M = 8-128 on Llama-3-8B's
# 4096 x 14336, 14336 x 4096 (K x N) and lm_head shapes, right or wrong and how fast
# (bench/qmm_probe.py --time): part R16's race timed it at 18-21 us on every shape at
# M = 16-64, the lm_head's 525 MB of codes included.
# Part TST: tests/test_cuda.py -k subnormal again, on the tree with the 8-byte loads back
# and the short last block's recursive dispatch (machine code unlike part LDS's and
# 2aed9d2's: bench/sass_diff.py).
# Part NC2: part NCU's Nsight Compute run alone, and the same on the per-channel TMA GEMM's
# 128 x 128 tile (M = 2048, 4096 x 14336), each summarized by bench/ncu_summary.py.
# Part SWT: the swapped subnormal tile (gswp128: weight rows as wgmma's A, two S per
# thread and group) in the subnormal tests, its kernel times beside gsub128 (tile_gpu_time
# --sub), then the 4-layer prefill bench from the 8-bit gs64 checkpoint with the prior's
# subnormal tile now gswp128.
# Part NC3: Nsight Compute on the swapped tile (M = 2048, 4096 x 14336), summarized.
# Part GSZ: the subnormal tiles' kernel times at group sizes 32 and 128 (M = 2048): how
# the time follows the number of groups (promotions and waits) per k.
# Part SW2: part SWT's tests and kernel times again, the swapped tile's producer loading
# each block's group sums before its wait for the stage (part NC3: consumers waiting on
# full[s], the producer on those loads).
# Part SW2T: part SW2's kernel times alone. Part QRC: bench/qmm_chain_probe.py --race
# (the tuner's own timing call with every candidate, then without one ingredient at a
# time) at M = 16 on 4096 x 14336 (N x K).
# Part Q1: part R16's race (checks off) on the lm_head and 4096 x 14336 (N x K) at M = 16: does
# mx.quantized_matmul time at ~19 us again there, where part QCH's probe of the tuner's
# timing gave 434 us?
# Part QCH: bench/qmm_chain_probe.py on the lm_head shape at M = 16, then 4096 x 14336:
# mlx_qmm's arm timed as the tuner does and with one ingredient dropped at a time.
# Parts LDS, R16 and NCU ran on one NVIDIA H100 in one call (tree 82cfdbe, the 16-byte
# loads in the package, DEADLINE=470): NCU's Nsight Compute run was not reached. Parts QMM
# and TST ran on another NVIDIA H100 (tree b8ce34d, DEADLINE=260); parts QCH and NC2 on
# another (tree c8ab7ee, DEADLINE=400); parts SWT and Q1 on another (tree 71a990f, the
# swapped tile in the package, DEADLINE=560; Q1's shapes were mistyped, rc=2); parts Q1,
# GSZ and NC3 on another (tree 6fc4d42, DEADLINE=330; GSZ reached its limit after group
# size 32). Parts SW2, SW2T and QRC have not run (SW2 and SW2T need the swapped tile with
# its producer's loads moved: commit 3016388, reverted by 6d3e109).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/h100_g}
mkdir -p "$O" tmp_t
L="$O/g.log"
. "$(dirname "$0")/device_run.sh"  # run LIMIT CMD...: into $L, within DEADLINE
N=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
for part in "$@"; do  # parts in order, one process: DEADLINE holds for them all
echo "===== part $part, tree ${TREE:-?}, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -n 1)" >> "$L"
if [ "$part" = "lds" ]; then
  run 150 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "subnormal"
  run 150 python3 bench/tile_gpu_time.py --grouped 64 --sub --bits 8 --m 2048,512,16 \
    --kn 4096x14336,14336x4096 --reps 5 --kernel-dir exp/lds64
fi
if [ "$part" = "r16" ]; then
  rm -f tmp_t/r16.json
  run 130 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped --group-size 64 \
    --m 16,32,64 --table tmp_t/r16.json --no-progress --sibling-check off \
    --prefill-check off --decode-check off
  cp tmp_t/r16.json "$O/r16_grouped.json"
  args="--model llama-3-8b --weights 8bit-gs64 --layers 4 --tokens 128 --decode 32 --batch 16 --rounds 3 --warm-up"
  run 90 python3 -m mlx_w8a8.bench $args
  run 90 python3 -m mlx_w8a8.bench $args --table tmp_t/r16.json
fi
if [ "$part" = "tst" ]; then
  run 120 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "subnormal"
fi
if [ "$part" = "qmm" ]; then
  run 120 python3 bench/qmm_probe.py --m 8,16,32,64,128 --n 4096,14336 --k 4096,14336 \
    --dtype bfloat16 --time 10
  run 90 python3 bench/qmm_probe.py --m 8,16,64,128 --n 128256 --k 4096 --dtype bfloat16 --time 10
fi
if [ "$part" = "qch" ]; then
  run 60 python3 bench/qmm_chain_probe.py --m 16 --n 128256 --k 4096
  run 40 python3 bench/qmm_chain_probe.py --m 16 --n 4096 --k 14336
fi
if [ "$part" = "swt" ]; then  # the swapped subnormal tile: exact, how fast, the model
  run 200 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "subnormal"
  run 120 python3 bench/tile_gpu_time.py --grouped 64 --sub --bits 8 --m 2048,512,128,16 \
    --kn 4096x14336,14336x4096 --reps 5
  run 150 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs64 --layers 4 \
    --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up
fi
if [ "$part" = "sw2" ]; then  # the swapped tile with its producer's group-sum loads moved
  run 150 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "subnormal"
  run 100 python3 bench/tile_gpu_time.py --grouped 64 --sub --bits 8 --m 2048,512 \
    --kn 4096x14336,14336x4096 --reps 5
fi
if [ "$part" = "sw2t" ]; then  # part SW2's kernel times alone
  run 90 python3 bench/tile_gpu_time.py --grouped 64 --sub --bits 8 --m 2048,512 \
    --kn 4096x14336,14336x4096 --reps 5
fi
if [ "$part" = "qrc" ]; then  # the tuner's own timing call on mlx_qmm and its variants
  run 100 python3 bench/qmm_chain_probe.py --m 16 --n 4096 --k 14336 --race
fi
if [ "$part" = "nc3" ]; then  # Nsight Compute on the swapped subnormal tile (STAGES 4, 8-bit)
  run 150 ncu -f --set full --import-source no -o "$O/ncu_swp" -k "regex:subnormal.*_128_4_4_8_" \
    -c 1 python3 bench/tile_gpu_time.py --once --grouped 64 --sub --bits 8 --m 2048 --kn 4096x14336
  ncu_report ncu_swp
fi
if [ "$part" = "gsz" ]; then  # the subnormal tiles at group sizes 32 and 128 (per-group cost)
  run 100 python3 bench/tile_gpu_time.py --grouped 32,128 --sub --bits 8 --m 2048 \
    --kn 4096x14336,14336x4096 --reps 5
fi
if [ "$part" = "q1" ]; then  # part R16's race on the lm_head alone at M = 16
  rm -f tmp_t/q1.json
  run 90 python3 -m mlx_w8a8.tune --shapes 16x128256x4096 16x4096x14336 --format grouped --group-size 64 \
    --table tmp_t/q1.json --no-progress --sibling-check off --prefill-check off --decode-check off
fi
if [ "$part" = "nc2" ]; then  # NCU's Nsight Compute runs alone, with the per-channel 128 x 128 tile
  NC="ncu -f --set full --import-source no"
  G="--m 2048 --kn 4096x14336"
  run 150 $NC -o "$O/ncu_sub" -k regex:subnormal -c 1 python3 bench/tile_gpu_time.py --once --grouped 64 --sub --bits 8 $G
  run 100 $NC -o "$O/ncu_pc128" -k regex:gemm_ws -c 1 python3 bench/tile_gpu_time.py --once --tiles tma128 $G
  ncu_report ncu_sub
  ncu_report ncu_pc128
fi
if [ "$part" = "ncu" ]; then
  run 60 python3 bench/tile_gpu_time.py --tiles tma256,tma128 --m 2048,16 --kn 4096x14336,14336x4096
  run 150 ncu -f --set full --import-source no -o "$O/ncu_sub" -k regex:subnormal -c 1 \
    python3 bench/tile_gpu_time.py --once --grouped 64 --sub --bits 8 --m 2048 --kn 4096x14336
  ncu_report ncu_sub
fi
done
grep -E "^(=====|rc=|[0-9]+ passed|FAILED|prefill|decode|M |M=|[0-9]+ +[0-9]+ +[0-9]+ |   )" "$L" | head -150
