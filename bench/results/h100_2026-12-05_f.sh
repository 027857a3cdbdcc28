#!/bin/bash
# Device runs F to M, 2026-12-05 (from part L each part's header line names the GPU): the 4-bit kernels
# (cuda_w4a8_gemm_tma, cuda_w4a8_gemv) first time on a GPU, and what came with them.
# Every part appends to f.log (kept as h100_2026-12-05_f.log):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h100_2026-12-05_f.sh f
#   . .device-mlx/mlx-env.sh && OUT=<dir> TREE=<commit> DEADLINE=<s> bash bench/results/h100_2026-12-05_f.sh l m   # parts g-n, in order
# Part F ran on tree c272acd, before the part switch and its header line were added (so
# f.log starts with its first command); part G's header line names its tree.
# Part F:
# 1) its exactness tests (tests/test_cuda.py, W4A8 oracle; the 8-bit form's candidate
#    test as a regression check of the shared kernel file);
# 2) op level, Llama-3-8B shapes, gs64, bf16: the 4-bit GEMM and the 8-bit group-wise
#    and per-channel TMA GEMMs, each against its format's mx.quantized_matmul;
# 3) tune --format grouped4 (gs64) at M = 2048, 512, 128 into a copy of the shipped table;
# 4) the 4-layer model bench from an mlx-lm 4-bit gs64 checkpoint with that table.
# (The op-level benches of 2) ran past their 25-30 s limits and printed nothing; the
# tune's H100 entries are kept as h100_2026-12-05_f_table.json, its sibling check was
# cut by the limit.)
# Part G: the default path (the CUDA prior's 4-bit rule, no table) from mlx-lm 4-bit
# checkpoints of group size 64, 32 and 128; then the same-device op-level figures of the
# 8-bit per-channel and group-wise TMA GEMMs on the shapes of part F's tune (tune, its
# checks off), for the 4-bit GEMM's speed against them.
# Part H: activation groups on CUDA (cuda_act_groups_gemm_tma, first run): its tests,
# then tune --act-scales group for both code widths (gs64) and the 4-layer bench from the
# 4-bit and 8-bit gs64 checkpoints with --act-groups and the tuned table.
# Part I: the server benchmark (bench/serve_compare.py) on the 32-layer Llama-3-8B shape:
# mlx_lm.server on the bf16 and mlx-lm 8-bit folders, mlx_w8a8.server --quantize on the
# bf16 one and mlx_w8a8.server on the 8-bit one, 1 / 8 / 32 concurrent requests of 128
# tokens (the folders are written on the first run and reused).
# Part J: the 4-bit GEMV (cuda_w4a8_gemv, first run): its tests (with the sibling test's
# 4-bit rows), then tune --format grouped4 at decode sizes with the model's decode check
# (the GEMV against mx.quantized_matmul at 4 bits, per the affine projection tuner) and
# the 4-layer bench's decode at B = 1 and 16 from the 4-bit gs64 checkpoint with it.
# Part K: what outlier channels (the recipe's split, 32 per layer) cost on CUDA: the
# 4-layer bench with --outliers 32 (the plain and the split model in the same rounds).
# Part L (first run): batched decode through mx.quantized_matmul with the rows as one
# matrix (plans.layer_plan): the 4-layer bench from the mlx-lm 8-bit and 4-bit gs64
# checkpoints at B = 4, 16, 64 (the mlx_w8a8 arm runs mx.quantized_matmul where no
# W8A8 kernel is chosen; mlx-lm's arm passes [B, 1, K] as before), the Phi-3-mini
# shape (fused q/k/v and gate/up) from bf16 at the same B.
# Part M (first run): part J's tune again with its decode check (the sibling-group fix)
# into a fresh table. From part L on, each rc line also gives the command's seconds.
# Part N (for a short call): part L's 4-bit bench, then part H's exactness tests of the
# activation-group GEMM.
# Parts K and J ran later that day on an H100, in one call (tree 1a2fae0), K first; the
# call's limit cut part J's bench, which was then run on the same machine in two shorter
# forms with part J's table (their commands are in the log). Part J's tune stopped in its
# decode check (a forced GEMV met the batched prompt's M = 28; fixed since). Part L ran
# on an NVIDIA H200 (tree 0f599cd, DEADLINE=400): its 8-bit and Phi-3 benches; its
# 4-bit bench and part M did not fit. Parts G, H and I have not run yet.
# Part O: the group-wise TMA GEMM's consumer MMA order (GroupedTmaConfig.order) against
# the unordered tiles, kernel times at M = 2048 / 512 on Llama-3-8B shapes, 8- and 4-bit
# codes at group size 64 (outputs compared bit for bit), then its exactness tests.
# Parts O, I and N (bench only) ran on an NVIDIA H200 (tree 57be195), with the second
# server run and a second mma_order test run beside them (their commands in the log).
# Part P: part I with every server's listen backlog at 128 (serve_compare's default
# since) plus the requantized arm (five arms, so its limit is part I's).
# Part R: the 8-bit server's conc-32 level, slow in parts I and P after levels 1 and 8
# and fast when its server met conc 32 first on a machine that had run the levels before:
# the same arm twice on a fresh machine, each after the other, with MLX's compiled-module
# cache (its on-disk PTX) listed after each and the server logs kept.
# Part S: part R's first run after the fix (the warm-up calls mx.quantized_matmul at each
# M tile MLX compiles, and a model pass), the server's own warm-up alone (--warm-tokens 0).
# Part T: the five-arm server comparison again with each arm's unmeasured warm-up pass
# (serve_compare's default since part S) at levels 8 and 32.
# Part V: batched decode from bf16 (4 layers, shipped table or prior): Llama-3-8B and
# Qwen2.5-7B shapes at B = 4, 16, 64.
# Part Q: batched decode B = 8 / 32 on 32 layers, then part H's exactness tests.
# Parts Y, Y2, Z and Z2 (for an NVIDIA H200, each one call; Z ran on an H100, the
# others not yet): Y re-measures the shipped table's per-channel entries into a copy holding its group-wise
# ones alone (the output is the table to ship), now with the batched-decode
# buckets M = 2 and 4 (the decode check on all 32 layers at M = 1, then the sibling and
# prefill checks at M >= 16); Y2 the group-wise gs64 entries at M = 2 ... 2048 into
# another; Z the batched-decode rows of issue 49 (4 layers: Llama-3-8B, Qwen2.5-7B and
# Phi-3-mini shapes at B = 4, 16, 64; 32 layers at B = 32); Z2 the four-arm server
# comparison; Z3 the same for mlx-lm 4-bit folders (mlx_lm.server and mlx_w8a8.server on
# the 4-bit checkpoint, with mlx_lm.server on bf16 beside them; ran on an NVIDIA H100,
# tree 35928df, DEADLINE=585). Z4: the CUDA prior's
# group-wise decode rules in a model for the first time: the 4-layer bench from mlx-lm
# 8-bit and 4-bit gs64 checkpoints, decode at B = 1, 4, 16, 64 (no table). Part Z5 (run
# inline after Z4, its commands in the log): tune --format grouped4 at M = 8 ... 64, then
# the 4-bit bench at B = 16, 64 with that table. Part Z6: the prior's 4-bit rules from
# part Z5 (GEMV at M = 8-16, the TMA GEMM from 17) in the 4-bit bench with no table, then
# decode at B = 1 from the 8-bit gs64 checkpoint in more rounds (its B = 1 ratio to
# mlx-lm 8-bit, where both run mx.quantized_matmul, moved 0.86-1.00 in part Z4).
# Part LIVE: the group-wise TMA GEMM's rows-past-M skip (GroupedTmaConfig.live), first
# run: its tests, then its kernel time against the plain tiles at decode and prefill
# sizes, 8- and 4-bit codes at group size 64. It ran on an NVIDIA H200 (tree 43ff202,
# DEADLINE=560): the tests' limit cut the last of its 36 cases (35 passed), and the 4-bit
# timing did not fit. Part LIVE2, after grouped_tma_tile_for turned the skip on at
# M = 17-112: the 4-bit timing at M = 16 and 64, then batched decode B = 16 / 64 from the
# mlx-lm 4-bit and B = 64 from the 8-bit gs64 checkpoint (4 layers, no table on an H100).
# Part PIPE: the group-wise TMA GEMM's pipelined promotion (GroupedTmaConfig.pipe: two
# int32 sets, each group promoted under the next group's wgmmas), first run: its kernel
# time against the plain tiles at prefill and decode sizes (outputs compared bit for bit),
# 8- and 4-bit codes at group size 64 (with the skip too at M = 64), then group sizes 32
# and 128 at M = 2048 (8-bit). Part PIPET: its tests (exact, bit for bit the plain tile).
# Part W (run inline after parts T, V and M, its commands in the log): tune per-channel
# at M = 2, 4, 8 (the CUDA prior had no rule below 8), then part H's exactness tests.
# Part PIPE3: the pipelined promotion with the skip at M = 64 for group sizes 32 and 128
# (8-bit) and for 4-bit codes at group size 64. Limits: part PIPE's first run (H100) took
# 54-57 s for 6 rows of 9 arms at group size 64; its group sizes 32 / 128 command got one
# row of four in 90 s (each tile, run and group size compiles on first use).
# Part PIPE2: the 4-layer Llama-3-8B prefill from mlx-lm 8- and 4-bit gs64 checkpoints at
# T = 512 / 2048, the tile policy as shipped, then with tiles.PIPE_M = 128.. (the pipelined
# promotion from M = 128 with the tile's longest run), each in its own process.
# Parts ALL, G, PIPE3 and LIVE2 ran on one NVIDIA H100 (tree f4b9a1c; DEADLINE=570, 560
# and 540): PIPE3's group size 32 / 128 command was cut by its limit after one row, and
# LIVE2's last command (the 8-bit bench) by its limit.
# Part Q4PC: the 4-layer bench from an mlx-lm 4-bit gs64 checkpoint requantized per channel
# (load(per_channel=True)), then as stored, in one call.
# Part Y16: part Y's second command alone (M >= 16: prefill and batched sizes, with the
# sibling and prefill checks), into a fresh table, for a call too short for both.
# Part ALL: every case of tests/test_cuda.py (12 workers), then the 4-layer Llama-3-8B
# prefill from bf16 (per-channel, shipped table) for the no-regression check of issue 46.
# Part X: part V again with the prior's M = 2-7 rule from part W; tune --format grouped
# (gs64) at the decode sizes M = 2 ... 64, where the prior has no rule for mlx-lm 8-bit
# weights; the server comparison's bf16 and W8A8 arms after the rule.
# Part NCU: where the group-wise TMA GEMM's time goes, 8-bit gs64 at M = 2048, K = 4096,
# N = 14336: Nsight Compute's full set on the plain and MMA-ordered gtma128 launches and on
# the per-channel tma256 launch (details as text, the per-SASS-instruction source page as
# CSV, into the output folder, O), then three probe kernels timed against the shipped one in one process
# (tile_gpu_time --kernel-dir; their outputs differ by design): the promotion reduced to
# one add per accumulator (exp/nopromo), its terms made constants, no shared-memory
# loads (exp/noterm), and no MMAs, the promotion alone (exp/nomma); then a candidate
# change, R (and t) copied by cp.async two groups ahead into a per-warp ring instead of
# register loads one group ahead (exp/rk; outputs must equal the shipped kernel's), at
# M = 16 and 2048, 8- and 4-bit codes. The probes' files were in the call's tree, not in the
# repository: `python bench/grouped_probes.py exp` writes the same three files; exp/rk
# was slower and is not kept (docs/cuda.md).
# Part CS: the column split (GroupedTmaConfig.split, tile_gpu_time --split), from part
# NCU's finding (the terms' LDS are 70% of the group-wise GEMM's shared-memory
# wavefronts): each consumer warpgroup covers all 128 rows of the tile in two m64 blocks and
# half its columns, so one terms load serves 4 rows instead of 2 (outputs must equal the
# plain tile's bit for bit). Kernel times beside the plain tiles, 8-bit codes at group size
# 64 and M = 2048 (the two large Llama-3-8B shapes); its exactness tests; 4-bit codes; M = 512.
# Part CS ran on an NVIDIA H100 (tree fad022e, DEADLINE=220): the split was slower, and
# was removed after it (git keeps it: commit 71e2fae); the 4-bit timing was cut by its
# limit and the M = 512 one not run.
# Part YDC: part Y's first command again on part Y's output table (tmp_t/y.json copied
# back into the tree): its decode check, which part Y's limit had cut, measuring nothing again.
# Part SONLY: the probe bench/grouped_probes.py writes as exp/sonly (the promotion that
# would remain with the offset term o R out of the mainloop: the exact conversion and one
# FMA by s per accumulator, s loaded alone) timed beside the shipped kernel, 8- and 4-bit
# codes at group size 64, M = 512 / 2048 (its outputs differ by design).
# Part YH (for an NVIDIA H200): part Y with its commands in the other order: M >= 16
# (sibling and prefill checks) first, then the 4-layer prefill bench from bf16 with that
# table (issue 46's no-regression check), then M = 1-8 with the decode check until DEADLINE
# (each batch size's verdicts are kept as it ends; part YDC finishes a cut check).
# Part HDC (for an NVIDIA H100): the 4-layer bench from bf16 with the shipped H100 table
# (prefill T = 512 / 2048, decode B = 1, 4, 16, 64), then part YDC's command on a copy of
# that table: its B <= 16 entries already hold verdicts (mx.quantized_matmul, nothing left
# to judge there), so the check times what its runs' limits cut, B = 32 and 64.
# Part BDP: bench/batched_decode_probe.py (part HDC's bench decoded B = 4 at 0.80x bf16 on
# the H100 table's mx.quantized_matmul, where part Z's W8A8 kernels had run 1.25-1.29x):
# on 4 Llama-3-8B layers at B = 4 and 16, the batched decode with every linear on
# mx.quantized_matmul, on the race's choices, and with the down projections alone on
# theirs, then the decode check's verdicts on the same model and table.
# Parts HDC and BDP ran on NVIDIA H100s (trees 5de71e4 and 50b5843; DEADLINE=570 and 440),
# then, inline (its command in the log, part BDP32), the probe on all 32 layers at B = 4:
# there the direct rounds found the down projections on their W8A8 kernel 1.18x faster
# and every linear on the race's choices 1.25x, where the decode check that followed on
# the same model said 0.97x (p25 0.68x) and replaced them all (docs/tuning.md).
# Part BDC (for an NVIDIA H100): the decode check judging each group by taking it off the
# tuned model (was: by adding it to an all-reference one). The probe on all 32 layers at
# B = 4 with the arms that split the two (the down projections added to the former
# reference, "apart", and taken off the tuned model), then the 4-layer bench from bf16
# with the shipped H100 table (its batched entries left out after part BDP32).
# Part BDC2: the decode check as it was before part BDC (judging each group by adding it
# to the all-reference model; the file of commit 4f3d96c, loaded as a module beside the
# package's) and as it is, twice each, alternating, on one model and race table: the probe
# on all 32 layers at B = 4 as in part BDC, its check call running the four in turn.
# Part BDC3: is the batched verdict the host's? The probe as in part BDC (6 rounds; it now
# prints the host's microseconds per MLX op built and each arm's fastest and slowest
# round), then again pinned to cores 0-1 with a busy loop on each, the host's share halved.
# Part BDC4: the probe as in part BDC3's first command, 8 rounds, with two more arms, qmm
# and tuned with Python's cyclic collector disabled during the decode, and the collector's
# time per round for every arm (part BDC3: the tuned arms' rounds spread 7.8-13.7 ms, the
# qmm arm's 15.1-15.5).
# Part BDC5: part BDC4's probe, 6 rounds, with MLX's CUDA graphs off (MLX_USE_CUDA_GRAPHS=0:
# every kernel launched on its own; part BDC4 ruled the collector out, 2.6 ms per round).
# Part BDC6: part BDC5's probe with CUDA graphs on (as by default), printing every arm's
# rounds in order (part BDC5: without graphs the tuned arms' rounds still spread, 8.3-14.8 ms).
# Part BDCW (for an NVIDIA H100): the decode check judging each batch size's decisions as
# a whole first, on a GPU: the probe on 32 layers at B = 4 and 16 (its check call is the
# check as it is), then the tune of the H100 table's batched buckets with the batched pass
# on (the shipped file has no M = 2-16 entries; its output is the candidate for them).
# Parts BDC to BDC6 ran on NVIDIA H100s, each on a fresh one but BDC5 (trees d509332,
# b0e467b (its header says d509332+), 31c4827, 76b3884, 0907402, 80af95f).
# Parts Y, SONLY and YDC ran on one NVIDIA H100, asked for as an H200 (trees d2996af,
# d2996af, 5621e21; DEADLINE=585, 200, 470): Y's decode check was cut by its first
# command's limit, YDC's by its own after B = 16 (no verdicts at B = 32 and 64), and
# SONLY's 4-bit timing by its limit; YDC's output table, its H100 section, ships as
# mlx_w8a8/tables/nvidia-h100.json.
# Part DQ: the dequantizing GEMM (cuda_dequant_gemm, gemm_dequant.cu), first run on a
# GPU: its tests (tests/test_cuda.py -k dequant), then its kernel time beside bf16,
# mx.quantized_matmul and the group-wise TMA GEMM's tiles (bench/tile_gpu_time.py
# --grouped), 8-bit and 4-bit codes at group size 64, 8-bit at 32 and 128.
# Parts DQ, YH and ALL ran on one NVIDIA H200, in that order (tree a1b1822; DEADLINE=585
# each): DQ's last command was cut by its limit after group size 32 on 4096 x 14336, ALL's
# test run by its limit (735 passed, none failed); then ALL2 beside the script,
# `timeout -s INT 360 python3 -m pytest -q -n 16 -p no:cacheprovider -rs tests/test_cuda.py
# -k "not dequant"`, also cut (663 passed, none failed). YH's output table ships as
# mlx_w8a8/tables/nvidia-h200.json.
# Part DQM: the tuner's race on Llama-3-8B's shapes with the dequantizing GEMM among the
# candidates, 8-bit group size 32 and 4-bit group size 64 (checks off), each table then
# in the 4-layer prefill bench from that checkpoint format.
# Part DQP: the dequantizing GEMM's 128-token tile (8-bit gs64, M = 2048, 4096 x 14336)
# under Nsight Compute's full set: where its 0.41x bf16 goes (part DQ).
# Part DQX: mx.dequantize + mx.matmul (candidate mlx_dequant_matmul) in the tuner's race on
# Llama-3-8B's shapes at M = 2048, 512, 128 (checks off), 8-bit and 4-bit codes at group
# size 64, each table then in the 4-layer prefill bench from that checkpoint format.
# Parts DQP and DQX ran on NVIDIA H100s (trees 7196adc and f3b5e91, DEADLINE=300 and 585;
# DQP's summaries made on this machine from the files it wrote, appended after it).
# Part DQY: cuda_dequant_matmul (dequantize.cu, then mx.matmul), first run on a GPU: its
# tests, then part DQX's races and benches with it among the candidates.
# Part DQY ran on an NVIDIA H100 (tree 41425a3, DEADLINE=570; its header line says
# 7196adc, the device copy's own git answering TREE=$(git rev-parse ...)): its 8-bit
# bench was cut by its limit, and its cuda_dequant_matmul candidate test failed on the
# float32-accumulation bound (rewritten since, part DQZ); the dequantize tests passed.
# Part DQZ: part DQY's candidate test as rewritten after it failed there (MLX's float GEMM
# is not float32-exact), then the 4-layer prefill from the 8-bit gs64 checkpoint on the
# default path (no table on an H100 for group-wise weights: the CUDA prior's rules).
# Part DQW (written for an NVIDIA H200): part DQZ's test with the dequantize tests, the
# kernel times of the dequantize launch and of cuda_dequant_matmul beside the other
# group-wise kernels (bench/tile_gpu_time.py --grouped), and the 4-layer prefill from the
# 8-bit and 4-bit gs64 checkpoints on the default path (the shipped table on an H200, the
# prior elsewhere).
# Parts DQZ and DQW ran on an NVIDIA H100, one call each (tree 9521fe3, DEADLINE=560;
# no H200 came), so DQW's benches there ran the prior's rules, as DQZ's.
# Part DQT (for an NVIDIA H200): the group-wise gs64 buckets M = 512 and 2048 that the
# shipped table left out, tuned with every candidate (sibling check on) into a copy of it.
# Part DQO: the dequantize-then-matmul float weights made on a side stream, under the
# float GEMMs (bench/dequant_overlap.py: modes off / side / next, alternating rounds),
# from the 4-bit and 8-bit gs64 checkpoints, the prior's rules, then 8-bit with
# cuda_dequant_matmul forced (its T = 512 runs the TMA GEMM by the rules). Ran on an
# NVIDIA H100 (tree b2d5771, the one holding bench/dequant_overlap.py and the overlap
# modes, removed after it; DEADLINE=450; the header line's tree corrected from a
# mistyped TREE value).
# Part T8: the 8-bit folder under mlx_w8a8.server again, with the CUDA prior's present
# rules (the dequantize-then-matmul path from 1024 rows, batch-size rules), beside
# mlx_lm.server on bf16 (levels 8 and 32, as part T; the W8A8 arm first). Ran on an
# NVIDIA H100 (tree a8f6d98, DEADLINE=345).
# Part DQT2: the dequantizing GEMM with both operands by TMA, a 256-token tile and the
# producers' registers given to the consumers: its tests (-k dequant_gemm), then its
# tiles' kernel times beside the other group-wise kernels, 8-bit and 4-bit gs64. Ran on an
# NVIDIA H100 (tree eceae4b, DEADLINE=560).
# Part DQC: part DQT2's commands on the clustered form (two blocks share each token tile
# by TMA multicast). Part DQR: part DQY's races and 4-layer benches again with it.
# Parts DQC and DQR ran in one call on an NVIDIA H100 (tree 8d648e1, DEADLINE=585); DQR's
# two tables replaced part DQY's and F's group-wise M = 128-2048 entries in
# h100_2026-12-05_f_table.json. Part DQD (the default path after the prior followed DQR)
# ran after part DEN in one call on an NVIDIA H100 (tree 868bf17, DEADLINE=560): its
# 8-bit bench was cut by its limit in the warm-up (no figure), its 4-bit bench ran.
# Part DEN: the probes denorm and denorm2 of bench/grouped_probes.py (the promotion as one
# FMA of the int32 partial read as a float32 subnormal, and that FMA beside the offset
# term's) timed beside the shipped kernel, 8-bit codes at M = 512 / 2048 and 4-bit at 2048,
# group size 64 (their outputs differ by design).
# Part SUB: the subnormal promotion (cuda_w8a8_gemm_subnormal, cuda_w4a8_gemm_subnormal;
# bodies tma_subnormal*), first run on a GPU: its tests (tests/test_cuda.py -k
# subnormal), then its tiles' kernel times beside the other group-wise kernels, 8-bit and
# 4-bit codes at group size 64.
# Part SUBP: part SUB's tests again (the subnormal epilogue as its own struct), then the
# probes sub_nooff, sub_s8 and sub_nopromo of bench/grouped_probes.py (the
# subnormal body without its offset wgmma, with s8 x u8 wgmmas, with one add per
# accumulator) timed beside its tiles (<tile>+), 8-bit codes, group size 64.
# Part SUBR: part DQR's 8-bit race (every candidate, the subnormal promotion's among
# them) into a fresh table, then the 4-layer prefill bench from the 8-bit gs64 checkpoint
# with it.
# Parts DEN (with DQD), SUB, SUBP, SUB again and SUBR ran on NVIDIA H100s, one call each
# (trees 868bf17, 5a053ec, 57b999a, 320dd16, 5a47ee7; DEADLINE=560, 560, 420, 330, 260;
# SUBP asked for an H200 and got an H100; SUBR's header line's tree corrected from a
# mistyped TREE value). Part SUB's first run had the offset blocks accumulate into f,
# its second into their own set (the shipped form); SUBP's probes are of the first. SUBR's
# 21 entries replaced part DQR's group-wise 8-bit ones in h100_2026-12-05_f_table.json.
# Parts ALLA and ALLB (one call each, on an NVIDIA H200): tests/test_cuda.py in two halves
# by keyword (the group-wise, 4-bit, GEMV and dequantizing kernels; the rest), for the
# whole file's run there that parts ALL and ALL2 did not finish within a call.
set -u
# Part SPI: its exactness tests (tests/test_cuda.py -k subnormal), then the subnormal
# promotion's mainloop pipelined (two int32 sets, each group's promotion under the next
# group's wgmmas, the offset blocks' wgmma into f with the block's first group) as the
# package has it, kernel times (tile_gpu_time --sub: the subnormal tiles, the
# dequantizing GEMM, bf16) against the previous mainloop (<tile>+: exp/sub_old, the kernel
# files of commit b148acd). Part SPR: part SUBR's race and bench with it. Part SPX: the
# 4-bit tiles the same way, the per-channel TMA GEMM's 256-wide tile on those shapes, and
# the variant with the offsets in a set of their own (exp/v5). The exp folders are not
# kept: exp/sub_old held gemm_grouped_ws.cu and gemm_subnormal.cu of commit b148acd
# (git show b148acd:mlx_w8a8/shaders/cuda/<file>); exp/v5 held commit 382a23d's two files
# with the block's offset wgmma writing a set of its own (scale-d 0, write-only operands),
# that set added to f after the wait that completes it. Parts SPI, SPR and SPX ran
# on one NVIDIA H100 in one call (tree 5bf7b19, DEADLINE=570); SPR's 21 entries replaced
# part SUBR's in h100_2026-12-05_f_table.json.
# Part SPD: the default path (the CUDA prior with part SPR's rules, no table) from the
# mlx-lm 8-bit gs64 checkpoint, prefill and decode at B = 1 and 16; then group size 128's
# prefill (offset blocks of 4 groups). Part SPD ran on an NVIDIA H100 (tree b882c3f,
# DEADLINE=330): the group size 128 bench was cut by its limit in its first prefill.
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/h100_f}
mkdir -p "$O" tmp_t
L="$O/f.log"
. "$(dirname "$0")/device_run.sh"  # run LIMIT CMD...: into $L, within DEADLINE
for part in "${@:-f}"; do  # parts in order, one process: DEADLINE holds for them all
echo "===== part $part, tree ${TREE:-?}, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -n 1)" >> "$L"
if [ "$part" = "f" ]; then
run 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
  -k "w4a8_gemm_tma or w4a8_tma_extreme or w4a8_tma_sibling or (w4a8_tma_every_tile and 300) or test_w8a8_gemm_grouped_tma"
ok=$(tail -n 1 "$L")
C="2048x4096x4096 2048x14336x4096 2048x4096x14336 512x14336x4096 128x4096x4096"
run 30 python3 -m mlx_w8a8.bench --format grouped4 --group-size 64 --candidate cuda_w4a8_gemm_tma --pairs 30 --cases $C
run 25 python3 -m mlx_w8a8.bench --format grouped --group-size 64 --candidate cuda_w8a8_gemm_grouped_tma --pairs 30 --cases $C
run 25 python3 -m mlx_w8a8.bench --format per_channel --candidate cuda_w8a8_gemm_tma --pairs 30 --cases $C
if [ "${ok%% *}" = "rc=0" ]; then
  cp mlx_w8a8/tables/nvidia-h200.json tmp_t/f.json
  run 150 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped4 --group-size 64 \
    --m 2048,512,128 --table tmp_t/f.json --no-progress
  cp tmp_t/f.json "$O/f_nvidia-h200.json"
  run 150 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 4bit-gs64 --layers 4 \
    --tokens 512,2048 --decode 32 --batch 16 --rounds 3 --warm-up --table tmp_t/f.json
fi
fi
if [ "$part" = "g" ]; then
  run 170 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 4bit-gs64 --layers 4 \
    --tokens 512,2048 --decode 32 --batch 16 --rounds 3 --warm-up
  for gs in 32 128; do
    run 100 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 4bit-gs$gs --layers 4 \
      --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up
  done
  for fmt in per_channel grouped; do
    rm -f tmp_t/$fmt.json
    run 75 python3 -m mlx_w8a8.tune --model llama-3-8b --format $fmt --group-size 64 \
      --m 2048,512 --table tmp_t/$fmt.json --no-progress --sibling-check off \
      --prefill-check off --decode-check off
  done
fi
if [ "$part" = "h" ]; then
  run 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "act_groups"
  ok=$(tail -n 1 "$L")
  if [ "${ok%% *}" = "rc=0" ]; then
    rm -f tmp_t/h.json
    for fmt in grouped4 grouped; do
      run 100 python3 -m mlx_w8a8.tune --model llama-3-8b --format $fmt --group-size 64 \
        --act-scales group --m 2048,512,128 --table tmp_t/h.json --no-progress \
        --sibling-check off --prefill-check off --decode-check off
    done
    cp tmp_t/h.json "$O/h_table.json"
    for w in 4bit-gs64 8bit-gs64; do
      run 110 python3 -m mlx_w8a8.bench --model llama-3-8b --weights $w --layers 4 \
        --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up --act-groups --table tmp_t/h.json
    done
  fi
fi
if [ "$part" = "j" ]; then
  run 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
    -k "w4a8_gemv or (int8_gemv_sibling_launch and grouped4) or (stages_equal_run and w4a8)"
  ok=$(tail -n 1 "$L")
  if [ "${ok%% *}" = "rc=0" ]; then
    rm -f tmp_t/j.json
    run 200 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped4 --group-size 64 \
      --m 1,4,16 --table tmp_t/j.json --no-progress --sibling-check off --prefill-check off
    cp tmp_t/j.json "$O/j_table.json"
    run 150 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 4bit-gs64 --layers 4 \
      --tokens 128 --decode 32 --batch 16 --rounds 4 --warm-up --table tmp_t/j.json
  fi
fi
if [ "$part" = "k" ]; then
  run 300 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 512,2048 \
    --decode 32 --batch 16 --rounds 4 --warm-up --outliers 32
fi
if [ "$part" = "l" ]; then
  run 180 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs64 --layers 4 \
    --tokens 128 --decode 32 --batch 4,16,64 --rounds 4 --warm-up
  run 180 python3 -m mlx_w8a8.bench --model phi-3-mini --layers 4 --tokens 128 \
    --decode 32 --batch 4,16,64 --rounds 4 --warm-up
  run 180 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 4bit-gs64 --layers 4 \
    --tokens 128 --decode 32 --batch 4,16,64 --rounds 4 --warm-up
fi
if [ "$part" = "m" ]; then
  rm -f tmp_t/m.json
  run 240 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped4 --group-size 64 \
    --m 1,4,16 --table tmp_t/m.json --no-progress --sibling-check off --prefill-check off
  cp tmp_t/m.json "$O/m_table.json"
fi
if [ "$part" = "n" ]; then
  run 180 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 4bit-gs64 --layers 4 \
    --tokens 128 --decode 32 --batch 4,16,64 --rounds 4 --warm-up
  run 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "act_groups"
fi
if [ "$part" = "o" ]; then  # the group-wise TMA GEMM's MMA order against none, 8 and 4 bits
  S="--m 2048,512 --kn 4096x14336,14336x4096,4096x4096 --reps 5"
  run 170 python3 bench/tile_gpu_time.py $S --grouped 64
  run 130 python3 bench/tile_gpu_time.py $S --grouped 64 --bits 4
  run 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "mma_order"
fi
if [ "$part" = "p" ]; then  # part I again with every server's backlog at 128 and the requantized arm
  run 570 python3 bench/serve_compare.py --model llama-3-8b --folders serve-models \
    --levels 1,8,32 --max-tokens 128 --arms mlx_lm-bf16,mlx_lm-8bit,w8a8,w8a8-8bit,w8a8-8bit-pc \
    --json "$O/p_serve.json"
fi
if [ "$part" = "r" ]; then
  for i in 1 2; do
    echo "===== $(date +%T) run $i" >> "$L"
    run 220 python3 bench/serve_compare.py --model llama-3-8b --folders serve-models \
      --levels 1,8,32 --max-tokens 128 --arms w8a8-8bit --json "$O/r$i.json"
    echo "===== $(date +%T) the PTX cache after run $i" >> "$L"
    ls -l --time-style=+%T "${TMPDIR:-/tmp}"/mlx/*/ptx >> "$L" 2>&1
    cp serve-models/server_w8a8-8bit.log "$O/r${i}_server.log"
  done
fi
if [ "$part" = "s" ]; then
  run 350 python3 bench/serve_compare.py --model llama-3-8b --folders serve-models \
    --levels 1,8,32 --max-tokens 128 --arms w8a8-8bit --warm-tokens 0 --json "$O/s.json"
  echo "===== $(date +%T) the PTX cache after part S" >> "$L"
  ls -l --time-style=+%T "${TMPDIR:-/tmp}"/mlx/*/ptx | grep -v '\.cu$\|\.txt$' >> "$L" 2>&1
  cp serve-models/server_w8a8-8bit.log "$O/s_server.log"
fi
if [ "$part" = "t" ]; then
  run 580 python3 bench/serve_compare.py --model llama-3-8b --folders serve-models \
    --levels 8,32 --max-tokens 128 --arms mlx_lm-bf16,mlx_lm-8bit,w8a8,w8a8-8bit,w8a8-8bit-pc \
    --json "$O/t_serve.json"
fi
if [ "$part" = "v" ]; then
  for model in llama-3-8b qwen2.5-7b; do
    run 180 python3 -m mlx_w8a8.bench --model $model --layers 4 --tokens 128 --decode 32 \
      --batch 4,16,64 --rounds 4 --warm-up
  done
fi
if [ "$part" = "x" ]; then
  for model in llama-3-8b qwen2.5-7b; do
    run 120 python3 -m mlx_w8a8.bench --model $model --layers 4 --tokens 128 --decode 32 \
      --batch 4,16,64 --rounds 4 --warm-up
  done
  rm -f tmp_t/x.json
  run 150 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped --group-size 64 \
    --m 2,4,8,16,32,64 --table tmp_t/x.json --no-progress --sibling-check off --prefill-check off
  cp tmp_t/x.json "$O/x_table.json"
  run 240 python3 bench/serve_compare.py --model llama-3-8b --folders serve-models \
    --levels 8,32 --max-tokens 128 --arms mlx_lm-bf16,w8a8 --json "$O/x_serve.json"
fi
if [ "$part" = "y" ]; then  # on the shipped table's group-wise entries alone (its per-channel ones dropped)
  python3 -c "import json; t = json.load(open('mlx_w8a8/tables/nvidia-h200.json'))
for s in t['sections']: s['entries'] = [e for e in s['entries'] if e['weight_format'] != 'per_channel']
json.dump(t, open('tmp_t/y.json', 'w'), indent=1)"
  run 300 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,2,4,8 --pairs 8 --check-layers 32 \
    --table tmp_t/y.json --no-progress
  cp tmp_t/y.json "$O/y_table.json"
  run 260 python3 -m mlx_w8a8.tune --model llama-3-8b --m 2048,512,128,64,32,16 \
    --table tmp_t/y.json --no-progress
  cp tmp_t/y.json "$O/y_table.json"
fi
if [ "$part" = "yh" ]; then  # part Y in the order that saves the most when cut: M >= 16 and the model
  # bench with its table first, then M = 1-8 and the decode check (verdicts kept per batch size)
  python3 -c "import json; t = json.load(open('mlx_w8a8/tables/nvidia-h200.json'))
for s in t['sections']: s['entries'] = [e for e in s['entries'] if e['weight_format'] != 'per_channel']
json.dump(t, open('tmp_t/y.json', 'w'), indent=1)"
  run 270 python3 -m mlx_w8a8.tune --model llama-3-8b --m 2048,512,128,64,32,16 \
    --table tmp_t/y.json --no-progress
  cp tmp_t/y.json "$O/y_table.json"
  run 100 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 512,2048 --decode 0 \
    --batch 0 --rounds 4 --warm-up --table tmp_t/y.json
  run $(( ${DEADLINE:-600} - SECONDS - 10 )) python3 -m mlx_w8a8.tune --model llama-3-8b \
    --m 1,2,4,8 --pairs 8 --check-layers 32 --table tmp_t/y.json --no-progress
  cp tmp_t/y.json "$O/y_table.json"
fi
if [ "$part" = "hdc" ]; then  # the model with the shipped H100 table, then its decode check's B = 32 / 64
  run 170 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 512,2048 --decode 32 \
    --batch 4,16,64 --rounds 4 --warm-up
  cp mlx_w8a8/tables/nvidia-h100.json tmp_t/h.json
  run $(( ${DEADLINE:-600} - SECONDS - 10 )) python3 -m mlx_w8a8.tune --model llama-3-8b \
    --m 1,2,4,8 --pairs 8 --check-layers 32 --table tmp_t/h.json --no-progress
  cp tmp_t/h.json "$O/h_table.json"
fi
if [ "$part" = "bdp" ]; then  # does the decode check see what the batched decode sees?
  run $(( ${DEADLINE:-600} - SECONDS - 5 )) python3 bench/batched_decode_probe.py \
    --model llama-3-8b --layers 4 --batch 4,16 --rounds 8 --steps 32 --prompt 16
fi
if [ "$part" = "bdc" ]; then  # the check off the tuned model, against direct timing; then the bench
  run 330 python3 bench/batched_decode_probe.py --model llama-3-8b --layers 32 --batch 4 \
    --rounds 8 --steps 32 --prompt 16
  run $(( ${DEADLINE:-600} - SECONDS - 5 )) python3 -m mlx_w8a8.bench --model llama-3-8b \
    --layers 4 --tokens 512,2048 --decode 32 --batch 4,16,64 --rounds 4 --warm-up
fi
if [ "$part" = "bdc2" ]; then  # the former check and the present one, alternating, one model
  [ -s tmp_t/decode_check_4f3d96c.py ] || git show 4f3d96c:mlx_w8a8/tuning/decode_check.py > tmp_t/decode_check_4f3d96c.py
  run $(( ${DEADLINE:-600} - SECONDS - 5 )) python3 - <<'PY'
import importlib.util
import sys

from mlx_w8a8 import tuning

spec = importlib.util.spec_from_file_location("mlx_w8a8.tuning.decode_check_4f3d96c",
                                              "tmp_t/decode_check_4f3d96c.py")
former = importlib.util.module_from_spec(spec)
spec.loader.exec_module(former)
present = tuning.check_decode


def both(*args, **kw):
    for name, check in (("present", present), ("former", former.check_decode)) * 2:
        result = check(*args, **kw)
        print(f"{name} check:\n{result.describe()}", flush=True)
    return result


tuning.check_decode = both
spec = importlib.util.spec_from_file_location("probe", "bench/batched_decode_probe.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
sys.exit(probe.main(["--model", "llama-3-8b", "--layers", "32", "--batch", "4", "--rounds", "8",
                     "--steps", "32", "--prompt", "16"]))
PY
fi
if [ "$part" = "bdc3" ]; then  # the probe on its host as it is, then on half of two cores
  P="bench/batched_decode_probe.py --model llama-3-8b --layers 32 --batch 4 --rounds 6 --steps 32 --prompt 16"
  run 200 python3 $P
  taskset -c 0 sh -c 'while :; do :; done' & h0=$!
  taskset -c 1 sh -c 'while :; do :; done' & h1=$!
  run $(( ${DEADLINE:-600} - SECONDS - 5 )) taskset -c 0,1 python3 $P
  kill $h0 $h1
fi
if [ "$part" = "bdc4" ]; then  # the probe with the collector's time, and arms without it
  run $(( ${DEADLINE:-600} - SECONDS - 5 )) python3 bench/batched_decode_probe.py \
    --model llama-3-8b --layers 32 --batch 4 --rounds 8 --steps 32 --prompt 16
fi
if [ "$part" = "bdc5" ]; then  # the probe without CUDA graphs
  MLX_USE_CUDA_GRAPHS=0 run $(( ${DEADLINE:-600} - SECONDS - 5 )) python3 \
    bench/batched_decode_probe.py --model llama-3-8b --layers 32 --batch 4 --rounds 6 \
    --steps 32 --prompt 16
fi
if [ "$part" = "bdc6" ]; then  # the probe, every arm's rounds in order
  run $(( ${DEADLINE:-600} - SECONDS - 5 )) python3 bench/batched_decode_probe.py \
    --model llama-3-8b --layers 32 --batch 4 --rounds 6 --steps 32 --prompt 16
fi
if [ "$part" = "bdcw" ]; then  # the whole-first check on a GPU: probe, then the batched tune
  run 260 python3 bench/batched_decode_probe.py --model llama-3-8b --layers 32 --batch 4,16 \
    --rounds 8 --steps 32 --prompt 16
  cp mlx_w8a8/tables/nvidia-h100.json tmp_t/w.json
  run $(( ${DEADLINE:-600} - SECONDS - 10 )) python3 -m mlx_w8a8.tune --model llama-3-8b \
    --m 1,2,4,8,16 --pairs 8 --check-layers 32 --decode-check on --sibling-check off \
    --prefill-check off --table tmp_t/w.json --no-progress
  cp tmp_t/w.json "$O/w_table.json"
fi
if [ "$part" = "dq" ]; then  # the dequantizing GEMM, first run: its tests, then kernel times
  run 300 python3 -m pytest -q -p no:cacheprovider -x tests/test_cuda.py -k dequant
  ok=$(tail -n 1 "$L")
  if [ "${ok%% *}" = "rc=0" ]; then
    for bits in 8 4; do
      run 150 python3 bench/tile_gpu_time.py --grouped 64 --bits $bits --m 2048,512,128,16 \
        --kn 4096x14336,14336x4096,4096x4096,4096x1024
    done
    run 120 python3 bench/tile_gpu_time.py --grouped 32,128 --m 2048,512 \
      --kn 4096x14336,14336x4096
  fi
fi
if [ "$part" = "ydc" ]; then  # part Y's first command again on its output (its limit cut the decode check)
  run 440 python3 -m mlx_w8a8.tune --model llama-3-8b --m 1,2,4,8 --pairs 8 --check-layers 32 \
    --table tmp_t/y.json --no-progress
  cp tmp_t/y.json "$O/y_table.json"
fi
if [ "$part" = "q4pc" ]; then  # an mlx-lm 4-bit checkpoint requantized per channel, against as stored
  for w in 4bit-gs64-per-channel 4bit-gs64; do
    run 110 python3 -m mlx_w8a8.bench --model llama-3-8b --weights $w --layers 4 \
      --tokens 512,2048 --decode 32 --batch 16 --rounds 3 --warm-up
  done
fi
if [ "$part" = "y16" ]; then  # part Y's second command alone (M >= 16), into a fresh table
  rm -f tmp_t/y16.json
  run 270 python3 -m mlx_w8a8.tune --model llama-3-8b --m 2048,512,128,64,32,16 \
    --table tmp_t/y16.json --no-progress
  cp tmp_t/y16.json "$O/y16_table.json"
fi
if [ "$part" = "y2" ]; then
  rm -f tmp_t/y2.json
  run 560 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped --group-size 64 \
    --m 2,4,8,16,32,64,128,512,2048 --table tmp_t/y2.json --no-progress
  cp tmp_t/y2.json "$O/y2_table.json"
fi
if [ "$part" = "z" ]; then
  for model in llama-3-8b qwen2.5-7b phi-3-mini; do
    run 130 python3 -m mlx_w8a8.bench --model $model --layers 4 --tokens 128 --decode 32 \
      --batch 4,16,64 --rounds 4 --warm-up
  done
  run 150 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 128 --decode 16 \
    --batch 32 --rounds 3 --warm-up
fi
if [ "$part" = "z4" ]; then
  for w in 8bit-gs64 4bit-gs64; do
    run 170 python3 -m mlx_w8a8.bench --model llama-3-8b --weights $w --layers 4 --tokens 128 \
      --decode 32 --batch 4,16,64 --rounds 4 --warm-up
  done
fi
if [ "$part" = "z6" ]; then
  run 220 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 4bit-gs64 --layers 4 \
    --tokens 128 --decode 32 --batch 4,16,64 --rounds 4 --warm-up
  run 200 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs64 --layers 4 \
    --tokens 128 --decode 64 --batch 16 --rounds 8 --warm-up
fi
if [ "$part" = "live" ]; then
  run 300 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "live"
  for bits in 8 4; do
    run 150 python3 bench/tile_gpu_time.py --grouped 64 --live --bits $bits --m 1,16,64,128 \
      --kn 4096x14336,14336x4096,4096x4096
  done
fi
if [ "$part" = "live2" ]; then  # after the skip's policy (M = 17-112): 4-bit kernel A/B, then the models
  run 90 python3 bench/tile_gpu_time.py --grouped 64 --live --bits 4 --m 16,64 \
    --kn 4096x14336,14336x4096,4096x4096
  run 130 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 4bit-gs64 --layers 4 \
    --tokens 128 --decode 32 --batch 16,64 --rounds 4 --warm-up
  run 110 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs64 --layers 4 \
    --tokens 128 --decode 32 --batch 64 --rounds 4 --warm-up
fi
if [ "$part" = "pipet" ]; then  # pipelined promotion: its exactness tests
  run 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "pipelined"
fi
if [ "$part" = "pipe" ]; then  # pipelined promotion: kernel A/B (outputs compared bit for bit)
  for bits in 8 4; do
    run 120 python3 bench/tile_gpu_time.py --grouped 64 --pipe --bits $bits --m 2048,512 \
      --kn 4096x14336,14336x4096,4096x4096
  done
  run 60 python3 bench/tile_gpu_time.py --grouped 64 --live --pipe --bits 8 --m 64 \
    --kn 4096x14336,14336x4096
  run 200 python3 bench/tile_gpu_time.py --grouped 32,128 --pipe --bits 8 --m 2048 \
    --kn 4096x14336,14336x4096
fi
if [ "$part" = "z2" ]; then
  run 570 python3 bench/serve_compare.py --model llama-3-8b --folders serve-models \
    --levels 1,8,32 --max-tokens 128 --arms mlx_lm-bf16,mlx_lm-8bit,w8a8,w8a8-8bit \
    --json "$O/z2_serve.json"
fi
if [ "$part" = "all" ]; then  # the whole CUDA exactness suite, then the per-channel prefill
  N=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12" || echo "")
  run 420 python3 -m pytest -q $N -p no:cacheprovider -rs tests/test_cuda.py
  run 130 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 4 --tokens 512,2048 --decode 0 \
    --batch 0 --rounds 4 --warm-up
fi
if [ "$part" = "dqm" ]; then  # the dequantizing GEMM in the tuner's race and the model, 8-bit gs32 and 4-bit gs64
  for fw in "grouped 32 8bit-gs32" "grouped4 64 4bit-gs64"; do
    read -r fmt gs w <<< "$fw"
    rm -f tmp_t/dqm_$fmt.json
    run 150 python3 -m mlx_w8a8.tune --model llama-3-8b --format $fmt --group-size $gs \
      --m 2048,512,128 --table tmp_t/dqm_$fmt.json --no-progress --sibling-check off \
      --prefill-check off --decode-check off
    cp tmp_t/dqm_$fmt.json "$O/dqm_$fmt.json"
    run 110 python3 -m mlx_w8a8.bench --model llama-3-8b --weights $w --layers 4 \
      --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up --table tmp_t/dqm_$fmt.json
  done
fi
if [ "$part" = "dqx" ]; then  # mx.dequantize + mx.matmul (mlx_dequant_matmul) in the race, then the model with that table
  for fw in "grouped 64 8bit-gs64" "grouped4 64 4bit-gs64"; do
    read -r fmt gs w <<< "$fw"
    rm -f tmp_t/dqx_$fmt.json
    run 150 python3 -m mlx_w8a8.tune --model llama-3-8b --format $fmt --group-size $gs \
      --m 2048,512,128 --table tmp_t/dqx_$fmt.json --no-progress --sibling-check off \
      --prefill-check off --decode-check off
    cp tmp_t/dqx_$fmt.json "$O/dqx_$fmt.json"
    run 110 python3 -m mlx_w8a8.bench --model llama-3-8b --weights $w --layers 4 \
      --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up --table tmp_t/dqx_$fmt.json
  done
fi
if [ "$part" = "dqy" ]; then  # cuda_dequant_matmul (dequantize.cu + mx.matmul): tests, race, model
  run 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
    -k "dequantize_writes or dequant_matmul_candidate"
  for fw in "grouped 64 8bit-gs64" "grouped4 64 4bit-gs64"; do
    read -r fmt gs w <<< "$fw"
    rm -f tmp_t/dqy_$fmt.json
    run 110 python3 -m mlx_w8a8.tune --model llama-3-8b --format $fmt --group-size $gs \
      --m 2048,512,128 --table tmp_t/dqy_$fmt.json --no-progress --sibling-check off \
      --prefill-check off --decode-check off
    cp tmp_t/dqy_$fmt.json "$O/dqy_$fmt.json"
    run 100 python3 -m mlx_w8a8.bench --model llama-3-8b --weights $w --layers 4 \
      --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up --table tmp_t/dqy_$fmt.json
  done
fi
if [ "$part" = "dqz" ]; then  # part DQY's failed candidate test, rewritten; the 8-bit default path
  run 90 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "dequant_matmul_candidate"
  run 160 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs64 --layers 4 \
    --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up
fi
if [ "$part" = "dqw" ]; then  # on an NVIDIA H200: the dequantize-then-matmul path, then its table buckets
  run 90 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
    -k "dequant_matmul_candidate or dequantize_writes"
  run 100 python3 bench/tile_gpu_time.py --grouped 64 --bits 8 --m 2048,512 --kn 4096x14336,14336x4096 --reps 3
  for w in 8bit-gs64 4bit-gs64; do  # the default path: the shipped table and the prior
    run 140 python3 -m mlx_w8a8.bench --model llama-3-8b --weights $w --layers 4 \
      --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up
  done
fi
if [ "$part" = "dqt2" ] || [ "$part" = "dqc" ]; then  # the dequantizing GEMM: TMA operands, the 256-token tile (dqt2); clusters of two (dqc)
  N=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
  run 200 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "dequant_gemm"
  for bits in 8 4; do
    run 100 python3 bench/tile_gpu_time.py --grouped 64 --bits $bits --m 2048,512 \
      --kn 4096x14336,14336x4096 --reps 3
  done
fi
if [ "$part" = "dqr" ]; then  # part DQY's race again with the TMA dequantizing GEMM, then the model
  for fw in "grouped 64 8bit-gs64" "grouped4 64 4bit-gs64"; do
    read -r fmt gs w <<< "$fw"
    rm -f tmp_t/dqr_$fmt.json
    run 110 python3 -m mlx_w8a8.tune --model llama-3-8b --format $fmt --group-size $gs \
      --m 2048,512,128 --table tmp_t/dqr_$fmt.json --no-progress --sibling-check off \
      --prefill-check off --decode-check off
    cp tmp_t/dqr_$fmt.json "$O/dqr_$fmt.json"
    run 100 python3 -m mlx_w8a8.bench --model llama-3-8b --weights $w --layers 4 \
      --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up --table tmp_t/dqr_$fmt.json
  done
fi
if [ "$part" = "dqd" ]; then  # the default path (the prior's rules after part DQR, no table)
  for w in 8bit-gs64 4bit-gs64; do
    run 110 python3 -m mlx_w8a8.bench --model llama-3-8b --weights $w --layers 4 \
      --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up
  done
fi
if [ "$part" = "den" ]; then  # the one- and two-FMA promotions (probes denorm, denorm2) beside the shipped kernel
  python3 bench/grouped_probes.py exp > /dev/null
  for probe in denorm denorm2; do
    run 100 python3 bench/tile_gpu_time.py --grouped 64 --bits 8 --m 512,2048 \
      --kn 4096x14336,14336x4096 --reps 5 --kernel-dir exp/$probe
  done
  run 70 python3 bench/tile_gpu_time.py --grouped 64 --bits 4 --m 2048 \
    --kn 4096x14336,14336x4096 --reps 5 --kernel-dir exp/denorm
fi
if [ "$part" = "sub" ]; then  # the subnormal promotion: its exactness tests, then its tiles' kernel times
  N=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
  run 240 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "subnormal"
  for bits in 8 4; do
    run 100 python3 bench/tile_gpu_time.py --grouped 64 --bits $bits --m 2048,512 \
      --kn 4096x14336,14336x4096 --reps 5
  done
fi
if [ "$part" = "subp" ]; then  # its tests again, then where the subnormal tile's time goes: probes beside it
  N=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
  run 150 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "subnormal"
  python3 bench/grouped_probes.py exp > /dev/null
  for probe in sub_nooff sub_s8 sub_nopromo; do
    run 80 python3 bench/tile_gpu_time.py --grouped 64 --bits 8 --m 2048,512 \
      --kn 4096x14336,14336x4096 --reps 5 --kernel-dir exp/$probe
  done
fi
if [ "$part" = "subr" ]; then  # part DQR's 8-bit race and bench with the subnormal promotion among the candidates
  rm -f tmp_t/subr_grouped.json
  run 130 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped --group-size 64 \
    --m 2048,512,128 --table tmp_t/subr_grouped.json --no-progress --sibling-check off \
    --prefill-check off --decode-check off
  cp tmp_t/subr_grouped.json "$O/subr_grouped.json"
  run 110 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs64 --layers 4 \
    --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up --table tmp_t/subr_grouped.json
fi
if [ "$part" = "spi" ]; then  # the pipelined subnormal mainloop: its tests, then against the previous one (exp/sub_old)
  N=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
  run 150 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "subnormal"
  run 150 python3 bench/tile_gpu_time.py --grouped 64 --sub --bits 8 --m 2048,512 \
    --kn 4096x14336,14336x4096 --reps 5 --kernel-dir exp/sub_old
fi
if [ "$part" = "spr" ]; then  # part SUBR's race and bench with the pipelined mainloop
  rm -f tmp_t/spr_grouped.json
  run 130 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped --group-size 64 \
    --m 2048,512,128 --table tmp_t/spr_grouped.json --no-progress --sibling-check off \
    --prefill-check off --decode-check off
  cp tmp_t/spr_grouped.json "$O/spr_grouped.json"
  run 110 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs64 --layers 4 \
    --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up --table tmp_t/spr_grouped.json
fi
if [ "$part" = "spx" ]; then  # the 4-bit tiles, the per-channel reference, the offsets-in-their-own-set variant
  run 150 python3 bench/tile_gpu_time.py --grouped 64 --sub --bits 4 --m 2048,512 \
    --kn 4096x14336,14336x4096 --reps 5 --kernel-dir exp/sub_old
  run 60 python3 bench/tile_gpu_time.py --tiles tma256 --m 2048,512 --kn 4096x14336,14336x4096
  run 150 python3 bench/tile_gpu_time.py --grouped 64 --sub --bits 8 --m 2048,512 \
    --kn 4096x14336,14336x4096 --reps 5 --kernel-dir exp/v5
fi
if [ "$part" = "spd" ]; then  # the default path with part SPR's prior rules: 8-bit gs64, then gs128
  run 200 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs64 --layers 4 \
    --tokens 512,2048 --decode 32 --batch 16 --rounds 3 --warm-up
  run 120 python3 -m mlx_w8a8.bench --model llama-3-8b --weights 8bit-gs128 --layers 4 \
    --tokens 512,2048 --decode 0 --batch 0 --rounds 3 --warm-up
fi
if [ "$part" = "dqo" ]; then  # the float weights on a side stream
  run 150 python3 bench/dequant_overlap.py --weights 4bit-gs64 --tokens 512,2048 --rounds 5
  run 150 python3 bench/dequant_overlap.py --weights 8bit-gs64 --tokens 512,2048 --rounds 5 \
    --kernel cuda_dequant_matmul
fi
if [ "$part" = "t8" ]; then  # the 8-bit folder served, present rules, beside bf16
  run 330 python3 bench/serve_compare.py --model llama-3-8b --folders serve-models \
    --levels 8,32 --max-tokens 128 --arms w8a8-8bit,mlx_lm-bf16 --json "$O/t8_serve.json"
fi
if [ "$part" = "dqt" ]; then  # on an NVIDIA H200: the group-wise buckets the shipped table left out
  cp mlx_w8a8/tables/nvidia-h200.json tmp_t/dqt.json
  run 300 python3 -m mlx_w8a8.tune --model llama-3-8b --format grouped --group-size 64 \
    --m 2048,512 --table tmp_t/dqt.json --no-progress --prefill-check off --decode-check off
  cp tmp_t/dqt.json "$O/dqt_nvidia-h200.json"
fi
if [ "$part" = "dqp" ]; then  # where the dequantizing GEMM's time goes: Nsight Compute, 128-token tile
  run 240 ncu -f --set full --import-source no -o "$O/ncu_dq" -k regex:gemm_dequant -c 1 \
    python3 bench/tile_gpu_time.py --once --grouped 64 --m 2048 --kn 4096x14336
  ncu -i "$O/ncu_dq.ncu-rep" --page details > "$O/ncu_dq.txt" 2>&1
  ncu -i "$O/ncu_dq.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$O/ncu_dq.sass.csv.gz"
  rm -f "$O/ncu_dq.ncu-rep"
fi
if [ "$part" = "alla" ] || [ "$part" = "allb" ]; then  # tests/test_cuda.py in two halves, one per call
  N=$(python3 -c "import xdist" 2>/dev/null && echo "-n 16" || echo "")
  K="grouped or w4a8 or act_groups or gemv or dequant"
  [ "$part" = "allb" ] && K="not ($K)"
  # One BLAS thread per worker (the oracle's float64 products): 16 workers on 16 cores.
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
    run $(( ${DEADLINE:-600} - SECONDS - 10 )) python3 -m pytest -q $N -p no:cacheprovider -rs \
    tests/test_cuda.py -k "$K"
fi
if [ "$part" = "pipe3" ]; then  # with the skip at M = 64: group sizes 32 and 128, 4-bit codes
  run 120 python3 bench/tile_gpu_time.py --grouped 32,128 --live --pipe --bits 8 --m 64 \
    --kn 4096x14336,14336x4096
  run 70 python3 bench/tile_gpu_time.py --grouped 64 --live --pipe --bits 4 --m 64 \
    --kn 4096x14336,14336x4096
fi
if [ "$part" = "pipe2" ]; then  # the 4-layer prefill, tile policy as shipped, then with PIPE_M patched
  for w in 8bit-gs64 4bit-gs64; do
    args="--model llama-3-8b --weights $w --layers 4 --tokens 512,2048 --decode 0 --batch 0 --rounds 4 --warm-up"
    run 110 python3 -m mlx_w8a8.bench $args
    run 110 python3 -c "import runpy, sys; import mlx_w8a8.kernels.cuda.tiles as t; \
t.PIPE_M = range(128, 1 << 20); sys.argv[0] = 'bench'; runpy.run_module('mlx_w8a8.bench', run_name='__main__')" $args
  done
fi
if [ "$part" = "z3" ]; then
  run 570 python3 bench/serve_compare.py --model llama-3-8b --folders serve-models \
    --levels 1,8,32 --max-tokens 128 --arms mlx_lm-bf16,mlx_lm-4bit,w4a8 \
    --json "$O/z3_serve.json"
fi
if [ "$part" = "ncu" ]; then  # the group-wise TMA GEMM under Nsight Compute, then the probes
  NC="ncu -f --set full --import-source no"
  G="--m 2048 --kn 4096x14336"
  run 240 $NC -o "$O/ncu_g" -k regex:grouped_ws -c 2 python3 bench/tile_gpu_time.py --once --grouped 64 $G
  run 120 $NC -o "$O/ncu_pc" -k regex:gemm_ws -c 1 python3 bench/tile_gpu_time.py --once --tiles tma256 $G
  for r in ncu_g ncu_pc; do
    ncu -i "$O/$r.ncu-rep" --page details > "$O/$r.txt" 2>&1
    ncu -i "$O/$r.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$O/$r.sass.csv.gz"
    rm -f "$O/$r.ncu-rep"
  done
  for v in nopromo noterm nomma; do
    run 90 python3 bench/tile_gpu_time.py --grouped 64 $G --reps 5 --kernel-dir exp/$v
  done
  for bits in 8 4; do
    run 120 python3 bench/tile_gpu_time.py --grouped 64 --bits $bits --m 16,2048 \
      --kn 4096x14336,14336x4096 --reps 5 --kernel-dir exp/rk
  done
fi
if [ "$part" = "sonly" ]; then  # the promotion without the offset term (probe), beside the shipped kernel
  python3 bench/grouped_probes.py exp > /dev/null
  for bits in 8 4; do
    run 90 python3 bench/tile_gpu_time.py --grouped 64 --bits $bits --m 512,2048 \
      --kn 4096x14336,14336x4096 --reps 5 --kernel-dir exp/sonly
  done
fi
if [ "$part" = "cs" ]; then  # the column split against the plain tiles, then its tests
  S="--kn 4096x14336,14336x4096 --reps 5 --split"
  run 60 python3 bench/tile_gpu_time.py --grouped 64 --bits 8 --m 2048 $S
  N=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
  run 160 python3 -m pytest -q $N -p no:cacheprovider tests/test_cuda.py -k "split_is_the_same"
  run 50 python3 bench/tile_gpu_time.py --grouped 64 --bits 4 --m 2048 $S
  run 90 python3 bench/tile_gpu_time.py --grouped 64 --bits 8 --m 512 $S
fi
if [ "$part" = "q" ]; then
  run 170 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 128 --decode 16 \
    --batch 8,32 --rounds 3 --warm-up
  run 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "act_groups"
fi
if [ "$part" = "i" ]; then
  run 570 python3 bench/serve_compare.py --model llama-3-8b --folders serve-models \
    --levels 1,8,32 --max-tokens 128 --json "$O/i_serve.json"
fi
done
grep -E "^(=====|rc=|[0-9]+ passed|FAILED|prefill|decode|M |M=|[0-9]+ +[0-9]+ +[0-9]+ |   )" "$L" | head -120
