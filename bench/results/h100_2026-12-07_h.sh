#!/bin/bash
# Device runs H, 2026-12-07: the subnormal GEMM with its S stored as bfloat16 pairs and
# loaded during the group before. Every part appends to h.log (kept as
# h100_2026-12-07_h.log); each part's header line names its GPU and tree:
#   . .device-mlx/mlx-env.sh && OUT=<dir> TREE=<commit> DEADLINE=<s> bash bench/results/h100_2026-12-07_h.sh <parts>
# The S pairs and the 96-wide tile (commits 93ee429, 1e13844, with 934fa1e's compile-test
# allowance) were reverted untimed by d73a492 and brought back by b08f94f. The parts also
# need exp/base, the tree before (untracked):
#   mkdir -p exp/base && git archive 8038bdd mlx_w8a8 bench/tile_gpu_time.py bench/gpu_timeline.py | tar -x -C exp/base
# and exp/swp, the swapped tile with its producer fix (commit 3016388, reverted by 6d3e109):
#   mkdir -p exp/swp && git archive 3016388 mlx_w8a8 bench/tile_gpu_time.py bench/gpu_timeline.py | tar -x -C exp/swp
# Part SBP: tests/test_cuda.py -k subnormal (gsub96 among the tiles forced); the
# subnormal tiles' kernel times (tile_gpu_time --sub, 8-bit codes, group size 64; gsub96:
# the 96-wide tile with three int32 sets) on this tree, then in the same call
# on the tree before the change (exp/base: the package and tile_gpu_time.py of commit
# 8038bdd, S as float32 pairs loaded at each promotion); the 4-layer prefill bench from
# the 8-bit gs64 checkpoint on the default path (the prior: the subnormal GEMM from
# M = 128); then exp/swp's subnormal tiles (gsub128, gsub64 and the swapped gswp128 with its
# producer loading a block's group sums before its stage wait; outputs compared with the
# first tile's). Part SBP4: the 4-bit tiles, both trees. Part SBQ: part SBP's 8-bit kernel times at
# M = 2048 and 512 (this tree, then exp/base), then its tests, for a short call. Part SBR:
# part SBQ, then part SBP's prefill bench. Part SBT: part SBQ's first command alone (on
# 2026-12-07 its 80 s limit cut it in part SBQ, in the first shape's dequantizing-GEMM
# arms after every subnormal tile had run: the first process on that machine, which built
# every kernel).
# Run on 2026-12-07 (log h100_2026-12-07_h.log): DEADLINE=260 ... sbq on an NVIDIA H100,
# then part SBT's command directly on the same machine; parts SBP, SBP4 and SBR not run.
# Later on 2026-12-07 (runs I, the same log): the model benchmark from mlx-lm gs64
# checkpoints on the kernels as they are, the swapped tile with its producer fix, and the
# mx.quantized_matmul timing probe. Part SW3 needs exp/swp2 (untracked): this tree with
# the swapped tile and its producer fix brought back (git revert 6d3e109, conflicts
# resolved so that it reads S as the bfloat16 this tree stores; a 5-stage copy of the
# tile, gswp128s5, added), its tests, bench and pyproject.toml beside the package.
# Part SW3: exp/swp2's subnormal tiles in one process (gsub128, gsub64, gswp128,
# gswp128s5), 8-bit, group size 64, M = 2048 and 512. Part SW3T: its tests/test_cuda.py
# -k subnormal (every tile forced). Part T8: this tree's tiles, as SW3. Part MB8: the
# 4-layer Llama-3-8B prefill and decode bench from the 8-bit gs64 checkpoint on the
# default path; part MB4: the same from the 4-bit gs64 checkpoint. Part QRC:
# bench/qmm_chain_probe.py --race (docs/cuda.md, Not done). Part QRF: part QRC, then
# hand-built chains on inputs new every round (--fresh), the same on 14336 x 4096 (N x K),
# then the lm_head's again without MLX's CUDA graphs. Part QRG: QRF's lm_head probes
# alone, with --collide first (mlx_qmm raced against each other candidate alone). Part
# BDK: the 4-layer batched decode (B = 16) from the 8-bit gs64 checkpoint on
# the default path, then with the subnormal GEMM forced in every layer. Part BDQ (short):
# --collide --fresh 2 on the lm_head, then BDK's forced run. Part GRP (not run yet): the
# 4-layer model's outputs at each prompt length against its first output of that length,
# in other orders (bench/graph_reuse_probe.py), from the 4-bit and 8-bit gs64 checkpoints.
# Run (runs I): DEADLINE=565 ... sw3 mb8 sw3t (tree f5a6a30; an NVIDIA H100), then
# DEADLINE=520 ... t8 mb4 qrc on the same machine. Parts QRF, QRG, BDK and BDQ not run (no
# machine could be started).
# Runs J (2026-12-07): part GRP, then part BDQ (tree d1b6c38, an NVIDIA H100). Part CLG:
# bench/cluster_graph_probe.py (a clustered and a plain kernel in graphs of one key), the
# pairwise races again, and the dequantizing GEMM without clusters: its tests, its kernel
# times beside exp/old's (untracked: the package and tile_gpu_time.py of d1b6c38, the
# clustered form), and model outputs at odd prompt lengths.
#   mkdir -p exp/old && git archive d1b6c38 mlx_w8a8 bench/tile_gpu_time.py bench/gpu_timeline.py | tar -x -C exp/old
# Part MMA: cuda_int8_gemv_mma (tensor-core small-M GEMV): its tests, a race of every
# candidate at M = 16 on the 8-bit gs64 Llama-3-8B shapes (table kept as g16.json), the
# B = 16 decode bench with that table.
# Part MMB: the tensor-core GEMV's tests again (its sibling launches added) and the B = 16
# decode bench on the default path (the prior's new rule at M = 9-31).
# Runs J, later on other H100s: DEADLINE=420 ... mma (tree 95323a3; its bench cut by its
# 110 s limit, then run by hand with a longer one as part MMA2, on the same machine), then
# on a new machine DEADLINE=370 ... mmb (tree 4d095be; its bench cut by its 200 s limit,
# the first process on that machine, then run by hand as part MMB2).
# Part SMT (not run yet): the tensor-core GEMVs' tests (the 4-bit form's first run; the
# depth a template argument since part MMB), bench/small_m_gpu_time.py (the small-M
# kernels' CUPTI times at M = 16 and 32 on the Llama-3-8B gs64 shapes, depths 2 and 4),
# then a race of every candidate at M = 16 on the 4-bit gs64 shapes (table g4_16.json).
# Part SMR: races of every candidate at M = 8, 24, 32 (4-bit gs64) and 24 (8-bit gs64),
# then 4-layer B = 16 decode from the 4-bit gs64 checkpoint on the prior's rules.
# Part SMF: a race of every candidate at M = 8 (8-bit gs64); the 32-layer 4-bit gs64 folder
# served at 8 and 16 concurrent requests (the tensor-core GEMV's M range) beside mlx_lm.server.
# Part SMS: the 32-layer 8-bit gs64 folder served at 8 and 16 requests (the tensor-core
# GEMV's M range since part SMF) beside mlx_lm.server bf16.
# Part SMD: the GEMV's row tiles (RT 2, 4: tests, then kernel times), the 4-bit
# form's kernel times; 32-layer batched decode at B = 8 and 16 from both gs64 checkpoints,
# outside the server (parts SMF and SMS served 16 requests at 0.81-0.86x bf16, 8 at 1.01-1.16x).
# Runs L (2026-12-07, two more H100 machines): DEADLINE=540 ... smd (tree 4dda638; its
# 32-layer 4-bit bench not run: the deadline), then DEADLINE=520 ... smq (tree ff3419d). Part SMQ: the row
# tiles as gemv.mma_row_tiles picks them (two at M = 25-32 where the blocks fill the GPU):
# races of every candidate at M = 32 (8-bit and 4-bit gs64; the prior runs the TMA GEMMs
# there), the 4-layer B = 32 decode from the 8-bit gs64 checkpoint on the prior and with
# the 8-bit race's table, then the 4-bit form's kernel times at M = 32.
# Part SMV (not run yet): the shipped row tiles (8-bit) at M = 25 and 32 beside the other counts, then
# the 4-layer B = 32 decode from the 8-bit gs64 checkpoint on the prior's M = 32 rules.
# Part SMP (not run yet): per-channel weights (models converted from bf16) at M = 8, 16, 24
# with the tensor-core GEMV in the race (the prior runs the TMA / ws GEMMs there).
# Part BDK2: part BDK's bench with the group-wise TMA GEMM forced, then the subnormal GEMM
# forced again. Run (runs J, one NVIDIA H100): DEADLINE=540 ... grp bdq (tree d1b6c38),
# then on the same machine DEADLINE=520 ... clg, DEADLINE=250 ... bdk, and part BDK2's
# commands by hand (tree ed8414f).
# Part I2F: the group-wise GEMVs (dp4a and tensor-core) with each group's int32 sums started
# at 0x4B400000 and converted by one float subtract instead of an I2F (gemv.cuh,
# biased_to_float): small-M kernel times at M = 4, 8, 16, 32 (8-bit, then 4-bit codes) on
# this tree, then in the same call on exp/old (untracked: the package and benches of
# commit 815175e, the conversion by I2F), then the GEMVs' tests. Part I2FB: the 4-layer
# batched decode at B = 4, 16, 32 from the 8-bit gs64 checkpoint on this tree and on
# exp/old, then from the 4-bit gs64 checkpoint on this tree.
#   mkdir -p exp/old && git archive 815175e mlx_w8a8 bench/small_m_gpu_time.py bench/tile_gpu_time.py bench/gpu_timeline.py | tar -x -C exp/old
# (run first without gpu_timeline.py, whose absence failed exp/old's two commands). Part I2FO:
# exp/old's 8-bit kernel times, then this tree's, on two shapes. Part NCG: Nsight Compute's
# full set on the tensor-core GEMV at M = 32 on the lm_head (8-bit gs64, two row tiles),
# summarized by bench/ncu_summary.py. Part WRP: the tensor-core GEMV with four and two warps
# a block (mma_w4, mma_w2: K split among fewer warps, more blocks resident) beside the
# shipped eight, at M = 16, 24, 32 (8-bit) and 32 (4-bit). Part RING: the same kernel times
# with the cp.async ring arms (mma_s2-4, mma_r1s3: each warp's loads through S units of
# shared memory), 8-bit at M = 16, 24, 32 and 4-bit at 8, 16, 32, then the GEMV tests with
# the ring's bit-equality test. Part RING2 (short): the ring's tests, then its 8-bit kernel
# times at M = 16 and 32 on three shapes.
# Runs M (an NVIDIA H100): DEADLINE=560 ... i2f (tree 4b64569). Runs N (another H100):
# DEADLINE=380 ... ring2 (tree c2f8953; the ring, commit c763194, was reverted after it,
# so parts RING and RING2 need that tree). Parts WRP, RING, I2FO, I2FB and NCG not run.
# Part WRULE: gemv.mma_warps (two warps a block for group-wise 8-bit launches of at least
# 3 x SMS blocks): the tensor-core GEMV's tests with the fewer-warps cases, then the
# 4-layer B = 16 and 32 decode from the 8-bit gs64 checkpoint on the default path.
# Runs O (another H100): DEADLINE=212 ... wrule (tree a197681; its bench cut by its limit).
# Part WRB: part WRULE's bench (the 4-layer B = 16 and 32 decode from the 8-bit gs64
# checkpoint, default path) on this tree, then on exp/norule (untracked: this tree's package
# with MMA_GEMV_WARP_FILL set to 10**9, so every launch keeps eight warps), in one call:
#   mkdir -p exp/norule && git archive HEAD mlx_w8a8 | tar -x -C exp/norule
#   sed -i 's/^MMA_GEMV_WARP_FILL = 3$/MMA_GEMV_WARP_FILL = 10**9/' exp/norule/mlx_w8a8/kernels/cuda/gemv.py
# Part PRB: the subnormal mainloop's probes (bench/grouped_probes.py exp/probes: sub_nopromo,
# sub_acc, sub_nowait) beside the shipped subnormal tiles, 8-bit gs64, M = 2048 and 512 on
# 4096 x 14336 (K x N). Part MB8 / MB4 as above on an H200.
# Runs P (an NVIDIA H100): DEADLINE=565 ... wrb prb (tree 11052a0; WRB's first bench, the
# first process on that machine, cut by its 220 s limit, since 330 s).
# Runs Q (another H100): DEADLINE=520 ... wrb (tree 000c112), then part W4K by hand on the
# same machine: python3 bench/small_m_gpu_time.py --m 16,32 --bits 4
# --kn 4096x128256,4096x14336,14336x4096 --reps 5 (the 4-bit GEMV with 8, 4 and 2 warps).
# Part NCD: the tensor-core GEMV's tests with the 4-bit launches' default now two warps on
# wide launches, then Nsight Compute's full set on the dequantizing GEMM (4-bit gs64, its
# 256-token tile, M = 2048, 4096 x 14336 K x N), summarized into the log.
# Runs R (another H100): DEADLINE=250 ... ncd (tree dda26bc).
# Part DQ3: the dequantizing GEMM with three fragment sets (k-tiles in flight while the
# next k-tile's fragments are built; four at the end, where time is left) beside the
# shipped two, in one process per depth (bench/tile_gpu_time.py --kernel-dir: <tile>+
# built from exp/dq3, its outputs compared with the shipped tile's bit for bit), 4-bit
# then 8-bit codes, group size 64.
# exp/dq3 (untracked) holds gemm_dequant.cu with the template argument DEPTH (the
# fragment sets; wgmma.wait_group DEPTH - 1 after each k-tile's commit, the stage of
# k-tile kt - DEPTH + 1 released then), passed by --template. Then, in exp/adopt
# (untracked: the package and tests with DequantConfig.depth, every tile at depth 3), the
# dequantizing GEMM's tests (every tile forced, and each depth bit for bit against two sets).
# Runs S (an NVIDIA H100, after several failed starts): DEADLINE=555 ... dq3 (tree 947238f;
# exp/dq3 and exp/adopt are the kernel and package of commit 2ab624e: depth 3 as a
# template argument in exp/dq3, DequantConfig's depth 3 for every tile in exp/adopt).
# Part DQP: probes of the dequantizing GEMM (4-bit, group size 64, M = 2048
# and 512 on 4096 x 14336 K x N), timed as <tile>+ beside the shipped tiles (their outputs
# wrong by design), written first by python3 bench/grouped_probes.py exp/probes: dq_nodq
# builds each fragment from the loaded code words as they are (the shared-memory loads
# kept, the byte permutes and packed fmas gone), dq_noload from constants (no fragment
# loads either).
# Part SRP (runs T): bench/serve_replay.py, mlx_lm.server's loop replayed in one process
# (BatchGenerator, insertions every 0.5 s, each token's log-probability read or not) on 32
# layers of Llama-3-8B from the 8-bit gs64 checkpoint, bf16 against mlx_w8a8, at 8 and 16
# concurrent slots (docs/serving.md: served at 16 requests 0.81x bf16, at 8 1.16x).
# Runs T (another H100): DEADLINE=575 ... srp dqp (tree fccba7f). Part SRA not run (no
# machine could be started).
# Part SRA: part SRP with the reads aside (mlx_w8a8.token_reads, as mlx_w8a8.server
# reads since) against mlx-lm's: arms +item and +aside. Then part SMS (the 32-layer
# 8-bit folder served at 8 and 16 requests beside mlx_lm.server bf16) again, on this tree.
# Runs U (another H100): DEADLINE=480 ... sms sra (tree df1bd12; part SRA skipped by its
# limit), then parts SRA16 and SRA8 on the same machine (each part SRA's command at one
# level, its warm-up lines per layer left out of the log).
# Parts GQ8, GQ4, GP8, GP4, GM32 (other model shapes and group sizes from mlx-lm
# checkpoints, the default path, no tuning: the 4-layer bench of part MB8): Qwen2.5-7B
# from the 8-bit and 4-bit gs64 checkpoints, Phi-3-mini from the 8-bit gs128 and 4-bit
# gs32 ones, Llama-3-8B from the 8-bit gs32 one.
# Runs V (an NVIDIA H100): DEADLINE=575 ... gq8 gq4 (tree 816a971; both benches cut by
# their 200 s limits then, after their warm-ups and, in GQ8, its prefill and B = 1 rows).
# Runs W (another H100): DEADLINE=250 ... gp8 (tree 97cc49a). Parts GP4, GM32 not run.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/h100_h}
mkdir -p "$O" tmp_t
L="$O/h.log"
. "$(dirname "$0")/device_run.sh"  # run LIMIT CMD...: into $L, within DEADLINE
N=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
MB="--model llama-3-8b --layers 4 --tokens 512,2048 --decode 16 --batch 16 --rounds 3 --warm-up"
BD="--model llama-3-8b --layers 4 --tokens 16 --decode 16 --batch 16 --rounds 5 --warm-up --weights 8bit-gs64"  # B = 16 decode
T8="--grouped 64 --sub --m 2048,512 --kn 4096x14336,14336x4096 --reps 5 --bits 8"  # 8-bit kernel times (M = 2048, 512)
for part in "$@"; do  # parts in order, one process: DEADLINE holds for them all
echo "===== part $part, tree ${TREE:-?}, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -n 1)" >> "$L"
if [ "$part" = "sbp" ]; then
  T="--grouped 64 --sub --m 2048,512,128 --kn 4096x14336,14336x4096 --reps 5"
  run 120 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "subnormal"
  run 100 python3 bench/tile_gpu_time.py $T --bits 8
  run 90 python3 exp/base/bench/tile_gpu_time.py $T --bits 8
  run 150 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs64 --layers 4 \
    --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up
  run 90 python3 exp/swp/bench/tile_gpu_time.py $T8
fi
if [ "$part" = "sbp4" ]; then
  T="--grouped 64 --sub --m 2048,512,128 --kn 4096x14336,14336x4096 --reps 5"
  run 100 python3 bench/tile_gpu_time.py $T --bits 4
  run 100 python3 exp/base/bench/tile_gpu_time.py $T --bits 4
fi
if [ "$part" = "sbr" ]; then  # part SBQ, then part SBP's prefill bench
  run 80 python3 bench/tile_gpu_time.py $T8
  run 70 python3 exp/base/bench/tile_gpu_time.py $T8
  run 120 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "subnormal"
  run 150 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs64 --layers 4 \
    --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up
fi
if [ "$part" = "sbt" ]; then  # part SBQ's first command alone, with a longer limit
  run 125 python3 bench/tile_gpu_time.py $T8
fi
if [ "$part" = "sbq" ]; then  # part SBP's kernel times first (M = 2048, 512), then its tests
  run 80 python3 bench/tile_gpu_time.py $T8
  run 70 python3 exp/base/bench/tile_gpu_time.py $T8
  run 120 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "subnormal"
fi
if [ "$part" = "sw3" ]; then
  run 150 python3 exp/swp2/bench/tile_gpu_time.py $T8
fi
if [ "$part" = "sw3t" ]; then
  (cd exp/swp2 && run 150 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k subnormal)
fi
if [ "$part" = "t8" ]; then  # this tree's subnormal tiles, as part SW3
  run 120 python3 bench/tile_gpu_time.py $T8
fi
if [ "$part" = "mb8" ]; then
  run 200 python3 -m mlx_w8a8.bench $MB --weights 8bit-gs64
fi
if [ "$part" = "mb4" ]; then
  run 200 python3 -m mlx_w8a8.bench $MB --weights 4bit-gs64
fi
G="--layers 4 --tokens 512,2048 --decode 16 --batch 16 --rounds 3 --warm-up"
if [ "$part" = "gq8" ]; then run 330 python3 -m mlx_w8a8.bench --model qwen2.5-7b $G --weights 8bit-gs64; fi
if [ "$part" = "gq4" ]; then run 330 python3 -m mlx_w8a8.bench --model qwen2.5-7b $G --weights 4bit-gs64; fi
if [ "$part" = "gp8" ]; then run 235 python3 -m mlx_w8a8.bench --model phi-3-mini $G --weights 8bit-gs128; fi
if [ "$part" = "gp4" ]; then run 235 python3 -m mlx_w8a8.bench --model phi-3-mini $G --weights 4bit-gs32; fi
if [ "$part" = "gm32" ]; then run 300 python3 -m mlx_w8a8.bench --model llama-3-8b $G --weights 8bit-gs32; fi
if [ "$part" = "qrc" ]; then
  run 150 python3 bench/qmm_chain_probe.py --race
fi
if [ "$part" = "bdk" ]; then  # batched decode B = 16 from the 8-bit gs64 checkpoint: default, subnormal forced
  run 110 python3 -m mlx_w8a8.bench $BD
  run 110 python3 -m mlx_w8a8.bench $BD --kernel cuda_w8a8_gemm_subnormal
fi
if [ "$part" = "grp" ]; then  # outputs across prompts of other lengths (bench/graph_reuse_probe.py)
  run 150 python3 bench/graph_reuse_probe.py --weights 4bit-gs64 --lengths 100,200,1000 --rounds 3
  run 150 python3 bench/graph_reuse_probe.py --weights 8bit-gs64 --lengths 16,100,200,1000 --rounds 3
fi
if [ "$part" = "bdq" ]; then  # short: the pairwise races with fresh inputs, then BDK's forced run
  run 80 python3 bench/qmm_chain_probe.py --collide --fresh 2
  run 110 python3 -m mlx_w8a8.bench $BD --kernel cuda_w8a8_gemm_subnormal
fi
if [ "$part" = "qrg" ]; then  # part QRF's lm_head probes alone, the pairwise races first
  run 100 python3 bench/qmm_chain_probe.py --collide --race --fresh 3
  MLX_USE_CUDA_GRAPHS=0 run 120 python3 bench/qmm_chain_probe.py --race --fresh 2
fi
if [ "$part" = "qrf" ]; then  # part QRC with fresh inputs after it, then without CUDA graphs
  run 120 python3 bench/qmm_chain_probe.py --race --fresh 4
  run 90 python3 bench/qmm_chain_probe.py --race --fresh 4 --n 14336 --k 4096
  MLX_USE_CUDA_GRAPHS=0 run 150 python3 bench/qmm_chain_probe.py --race --fresh 2
fi
if [ "$part" = "bdk2" ]; then  # BDK's bench with the group-wise TMA GEMM forced, then the subnormal GEMM again
  for k in cuda_w8a8_gemm_grouped_tma cuda_w8a8_gemm_subnormal; do
    run 120 python3 -m mlx_w8a8.bench $BD --kernel $k
  done
fi
if [ "$part" = "mma" ]; then  # the tensor-core small-M GEMV: tests, a race at M = 16, B = 16 decode with its table
  run 150 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "gemv_mma or stages_equal"
  run 200 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped --group-size 64 --m 16 \
    --table tmp_t/g16.json --decode-check off --sibling-check off --prefill-check off --no-progress
  cp tmp_t/g16.json "$O/g16.json" 2>/dev/null
  run 110 python3 -m mlx_w8a8.bench $BD --table tmp_t/g16.json
fi
if [ "$part" = "mmb" ]; then  # the tensor-core GEMV with its sibling launches and the prior's M = 9-31 rule
  run 150 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "gemv_mma or stages_equal"
  run 200 python3 -m mlx_w8a8.bench $BD
fi
if [ "$part" = "smt" ]; then  # the small-M kernels' own GPU times; the 4-bit form's tests and race (not run yet)
  run 200 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "gemv_mma"
  run 150 python3 bench/small_m_gpu_time.py --m 16,32 --reps 5
  run 200 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped4 --group-size 64 --m 16 \
    --table tmp_t/g4_16.json --decode-check off --sibling-check off --prefill-check off --no-progress
  cp tmp_t/g4_16.json "$O/g4_16.json" 2>/dev/null
fi
if [ "$part" = "smr" ]; then  # the tensor-core GEMVs at M = 8, 24, 32; 4-bit B = 16 decode on the prior
  run 280 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped4 --group-size 64 --m 8,24,32 \
    --table tmp_t/g4_s.json --decode-check off --sibling-check off --prefill-check off --no-progress
  run 120 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped --group-size 64 --m 24 \
    --table tmp_t/g8_s.json --decode-check off --sibling-check off --prefill-check off --no-progress
  cp tmp_t/g4_s.json tmp_t/g8_s.json "$O/" 2>/dev/null
  run 150 python3 -m mlx_w8a8.bench ${BD/8bit-gs64/4bit-gs64}
fi
if [ "$part" = "smf" ]; then  # the 8-bit race at M = 8; the 4-bit folder served at 8 and 16 requests
  run 130 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped --group-size 64 --m 8 \
    --table tmp_t/g8_8.json --decode-check off --sibling-check off --prefill-check off --no-progress
  cp tmp_t/g8_8.json "$O/" 2>/dev/null
  run 420 python3 bench/serve_compare.py --model llama-3-8b --folders serve-models \
    --levels 8,16 --max-tokens 128 --arms mlx_lm-bf16,mlx_lm-4bit,w4a8 --json "$O/smf_serve.json"
fi
if [ "$part" = "sms" ]; then  # the 8-bit folder served at 8 and 16 requests beside mlx_lm.server bf16
  run 330 python3 bench/serve_compare.py --model llama-3-8b --folders serve-models \
    --levels 8,16 --max-tokens 128 --arms mlx_lm-bf16,w8a8-8bit --json "$O/sms_serve.json"
fi
if [ "$part" = "smd" ]; then  # row tiles; 4-bit kernel times; the served slowdown
  run 200 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "gemv_mma or row_tiles"
  run 120 python3 bench/small_m_gpu_time.py --m 16,24,32 --reps 5
  run 120 python3 bench/small_m_gpu_time.py --m 8,16,24 --bits 4 --reps 5
  for w in 8bit-gs64 4bit-gs64; do
    run 280 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --weights $w --tokens 16 \
      --decode 16 --batch 8,16 --rounds 4 --warm-up
  done
fi
if [ "$part" = "smq" ]; then  # row tiles by gemv.mma_row_tiles: 4-bit M = 32 times; races and decode at M = 32
  for f in grouped grouped4; do
    run 130 python3 -m mlx_w8a8.tune --model llama-3-8b --format $f --group-size 64 --m 32 \
      --table tmp_t/${f}_32.json --decode-check off --sibling-check off --prefill-check off --no-progress
    cp tmp_t/${f}_32.json "$O/" 2>/dev/null
  done
  B32="--model llama-3-8b --layers 4 --tokens 16 --decode 16 --batch 32 --rounds 4 --warm-up --weights 8bit-gs64"
  run 150 python3 -m mlx_w8a8.bench $B32
  run 120 python3 -m mlx_w8a8.bench $B32 --table tmp_t/grouped_32.json
  run 70 python3 bench/small_m_gpu_time.py --m 32 --bits 4 --reps 5
fi
if [ "$part" = "smv" ]; then  # (not run yet) the shipped row tiles at M = 25 and 32; B = 32 decode on the prior's M = 32 rules
  run 60 python3 bench/small_m_gpu_time.py --m 25,32 --kn 14336x4096,4096x14336,4096x128256 --reps 5
  run 175 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 16 --decode 8 --batch 32 \
    --rounds 3 --warm-up --weights 8bit-gs64
fi
if [ "$part" = "smp" ]; then  # (not run yet) per-channel weights at M = 8-24 with the tensor-core GEMV raced
  run 260 python3 -m mlx_w8a8.tune --model llama-3-8b --m 8,16,24 --table tmp_t/pc_s.json \
    --decode-check off --sibling-check off --prefill-check off --no-progress
  cp tmp_t/pc_s.json "$O/" 2>/dev/null
fi
if [ "$part" = "i2f" ]; then  # GEMV sums converted without I2F: kernel times beside exp/old's, tests
  S="--m 4,8,16,32 --kn 4096x4096,14336x4096,4096x14336,4096x128256 --reps 5"
  run 150 python3 bench/small_m_gpu_time.py $S
  run 120 python3 exp/old/bench/small_m_gpu_time.py $S
  run 70 python3 bench/small_m_gpu_time.py ${S/4,8,/8,} --bits 4
  run 70 python3 exp/old/bench/small_m_gpu_time.py ${S/4,8,/8,} --bits 4
  run 200 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "gemv"
fi
if [ "$part" = "wrp" ]; then  # the tensor-core GEMV's warps a block: 8 (shipped), 4, 2
  run 150 python3 bench/small_m_gpu_time.py --m 16,24,32 \
    --kn 4096x128256,4096x14336,14336x4096,4096x28672,4096x6144 --reps 5
  run 80 python3 bench/small_m_gpu_time.py --m 32 --kn 4096x128256,14336x4096 --bits 4 --reps 5
fi
if [ "$part" = "ring" ]; then  # the cp.async ring beside the register path; tests
  run 170 python3 bench/small_m_gpu_time.py --m 16,24,32 \
    --kn 4096x128256,4096x14336,14336x4096,4096x28672,4096x6144 --reps 5
  run 100 python3 bench/small_m_gpu_time.py --m 8,16,32 --kn 4096x128256,14336x4096,4096x14336 \
    --bits 4 --reps 5
  run 200 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "gemv_mma"
fi
if [ "$part" = "ring2" ]; then  # short: the ring's tests, then 8-bit kernel times
  run 150 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "ring_equals"
  run 150 python3 bench/small_m_gpu_time.py --m 16,32 --kn 4096x128256,4096x14336,14336x4096 --reps 5
fi
if [ "$part" = "wrb" ]; then  # the warps rule in the model: this tree, then exp/norule (8 warps always)
  B="--model llama-3-8b --layers 4 --tokens 16 --decode 8 --batch 16,32 --rounds 3 --warm-up --weights 8bit-gs64"
  run 330 python3 -m mlx_w8a8.bench $B
  echo "===== the next command in exp/norule" >> "$L"
  (cd exp/norule && run 170 python3 -m mlx_w8a8.bench $B)
fi
if [ "$part" = "prb" ]; then  # the subnormal mainloop's floor: probes beside the shipped tiles
  for p in sub_nopromo sub_acc sub_nowait; do
    run 110 python3 bench/tile_gpu_time.py --grouped 64 --sub --bits 8 --m 2048,512 \
      --kn 4096x14336 --reps 5 --kernel-dir exp/probes/$p
  done
fi
if [ "$part" = "ncd" ]; then  # the GEMV tests (4-bit default: two warps on wide launches); Nsight Compute on the 4-bit dequantizing GEMM
  run 90 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "gemv_mma"
  run 150 ncu -f --set full --import-source no -o "$O/ncu_dq" -k "regex:gemm_dequant" -c 1 \
    python3 bench/tile_gpu_time.py --once --grouped 64 --sub --bits 4 --m 2048 --kn 4096x14336
  ncu_report ncu_dq
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc Active|L1/TEX Hit|Shared Memory|Bank Conflicts|Theoretical Occupancy|Block Limit" "$O/ncu_dq.txt" >> "$L" 2>&1
fi
if [ "$part" = "dq3" ]; then  # the dequantizing GEMM with 3 and 4 fragment sets beside the shipped 2
  D="--grouped 64 --sub --m 2048,512 --kn 4096x14336,14336x4096 --reps 5 --kernel-dir exp/dq3"
  run 220 python3 bench/tile_gpu_time.py $D --bits 4 --template DEPTH=3
  run 150 python3 bench/tile_gpu_time.py $D --bits 8 --template DEPTH=3
  echo "===== the next command in exp/adopt" >> "$L"
  (cd exp/adopt && run 170 python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_cuda.py -k "dequant_gemm")
  run 100 python3 bench/tile_gpu_time.py $D --bits 4 --template DEPTH=4
fi
if [ "$part" = "dqp" ]; then  # the dequantizing GEMM's probes: fragments without dequantization, without loads
  python3 bench/grouped_probes.py exp/probes > /dev/null
  for p in dq_nodq dq_noload; do
    run 110 python3 bench/tile_gpu_time.py --grouped 64 --sub --bits 4 --m 2048,512 --kn 4096x14336 \
      --reps 5 --kernel-dir exp/probes/$p
  done
fi
if [ "$part" = "srp" ]; then  # the server's loop replayed: 32 layers, 8-bit gs64, 8 and 16 slots
  run 420 python3 bench/serve_replay.py --model llama-3-8b --layers 32 --weights 8bit-gs64 \
    --levels 8,16 --rounds 2 --json "$O/srp.jsonl"
fi
if [ "$part" = "sra" ]; then  # part SRP with the reads aside and as mlx-lm reads
  run 260 python3 bench/serve_replay.py --model llama-3-8b --layers 32 --weights 8bit-gs64 \
    --levels 8,16 --rounds 2 --reads item,aside --json "$O/sra.jsonl"
fi
if [ "$part" = "sra16" ] || [ "$part" = "sra8" ]; then  # part SRA at one level
  run 215 bash -c "python3 bench/serve_replay.py --model llama-3-8b --layers 32 \
    --weights 8bit-gs64 --levels ${part#sra} --rounds 2 --reads item,aside \
    --json $O/$part.jsonl 2>&1 | grep -v 'warm_up\] model'"
fi
if [ "$part" = "wrule" ]; then  # the warps rule: tests, then B = 16 / 32 decode
  run 90 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "gemv_mma"
  run 120 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 16 --decode 8 \
    --batch 16,32 --rounds 3 --warm-up --weights 8bit-gs64
fi
if [ "$part" = "i2fo" ]; then  # exp/old's 8-bit kernel times, then this tree's
  S="--m 4,8,16,32 --kn 4096x4096,4096x128256 --reps 5"
  run 150 python3 exp/old/bench/small_m_gpu_time.py $S
  run 60 python3 bench/small_m_gpu_time.py $S
fi
if [ "$part" = "ncg" ]; then  # Nsight Compute on the tensor-core GEMV, M = 32, lm_head, 8-bit gs64
  run 150 ncu -f --set full --import-source no -o "$O/ncu_gemv" -k "regex:w8a8_gemv_mma" -c 1 \
    python3 bench/small_m_gpu_time.py --m 32 --kn 4096x128256 --reps 1
  ncu_report ncu_gemv
fi
if [ "$part" = "i2fb" ]; then  # 4-layer batched decode B = 4, 16, 32: this tree, exp/old (8-bit), this tree (4-bit)
  B="--model llama-3-8b --layers 4 --tokens 16 --decode 8 --batch 4,16,32 --rounds 3 --warm-up"
  run 170 python3 -m mlx_w8a8.bench $B --weights 8bit-gs64
  (cd exp/old && run 170 python3 -m mlx_w8a8.bench $B --weights 8bit-gs64)
  run 170 python3 -m mlx_w8a8.bench $B --weights 4bit-gs64
fi
if [ "$part" = "clg" ]; then  # clusters and MLX's graph cache; the dequantizing GEMM without clusters
  run 40 python3 bench/cluster_graph_probe.py --lengths 1,2,3,5 --rounds 2
  run 80 python3 bench/qmm_chain_probe.py --collide --fresh 2
  run 150 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "dequant_gemm"
  run 100 python3 bench/tile_gpu_time.py $T8
  run 80 python3 exp/old/bench/tile_gpu_time.py $T8
  run 80 python3 bench/graph_reuse_probe.py --weights 4bit-gs64 --lengths 1000,101,200,37 --rounds 2
fi
done
grep -E "^(=====|rc=|[0-9]+ passed|FAILED|prefill|decode|M |M=|[0-9]+ +[0-9]+ +[0-9]+ |   )" "$L" | head -150
