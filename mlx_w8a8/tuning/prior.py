"""The built-in prior: which kernel runs an op when no table decides.

Used only when no tuning-table entry (any layer) and no borrowed decision from a nearby
measured shape exists. Each rule comes from a recorded measurement, cited beside it;
where nothing was measured the prior says nothing and the op's fallback runs:
``mx.quantized_matmul`` (``mlx_qmm``, ``mlx_qmm4`` for 4-bit weights) for a linear, as in
stock MLX, and the exact MLX-ops kernel for ``int8_matmul`` and ``quantize_activation``.

A rule is ``(m_min, m_max, min_weight, names)``: for ``m_min <= M <= m_max`` (``None`` =
no upper bound) and weights of at least ``min_weight`` elements (``N * K``) the first of
``names`` that can run the problem on this machine is used.
"""

from __future__ import annotations

from ..kernels.registry import EXACT, EXACT_ACT_GROUPS, EXACT_W4A8, QMM4, Candidate, Problem
from ..weight import GROUPED4

Rule = tuple[int, "int | None", int, tuple[str, ...]]

RULES: dict[tuple[str, str, str], list[Rule]] = {
    # CUDA, per-channel weights, measured on an NVIDIA H200 (MLX 0.32.4, bf16): the shipped
    # table mlx_w8a8/tables/nvidia-h200.json (tune --model llama-3-8b in dependent chains,
    # with the sibling groups' summed shapes q+k+v 6144 x 4096 and gate+up 28672 x 4096;
    # first at M = 1, 8, 16, 64, 128, 512, 2048 on 2026-12-01, the figures below, and
    # re-measured at M = 1-2048 on 2026-12-06; the tune logs are listed in
    # bench/results/README.md); tests/test_prior.py checks that these rules pick the
    # shipped table's kernel family (W8A8 or mx.quantized_matmul) on every entry (at
    # M = 2-7 within 1.10x of the winner's time). Within the family the rules name a
    # GEMM (the TMA GEMM at M = 8-15, the cp.async GEMM at 16-127, the TMA GEMM from 128
    # on); where another kernel won, the first named took at most 1.07x its time in that
    # race.
    # - M = 1: no rule, mx.quantized_matmul (MLX's GEMV there). The model's own decode
    #   loop (the decode check on all 32 layers) kept no W8A8 kernel (the GEMVs that won
    #   the per-shape race: 0.95x-0.99x, p25 0.91x-0.95x), decode being host-bound and a
    #   custom kernel launch costing more host time than a built-in op (docs/cuda.md).
    # - M = 2-7 (batched decode of a few sequences), weights from 4096 x 4096: measured on
    #   an NVIDIA H100 80GB HBM3 (tune --model llama-3-8b --m 2,4,8, kept in
    #   bench/results/h100_2026-12-05_f_table.json, part W of h100_2026-12-05_f.log).
    #   MLX's GEMV slows with each row (4096 x 14336: 86.8 us at M = 2, 141 us at M = 4;
    #   the lm_head 520 and 983 us) while the W8A8 kernels barely do: the fused GEMV won
    #   all 6 such shapes at M = 2 (1.08-2.26x mx.quantized_matmul) and 3 of 6 at M = 4
    #   (1.20-1.81x; the TMA GEMM or the cp.async GEMM won the others, the GEMV within
    #   1.14x of them and 2.3-3.6x faster than mx.quantized_matmul); at M = 8 the TMA
    #   GEMM won 4 of them. So the GEMV at M = 2-4 and the TMA GEMM at 5-7 (between
    #   the measured 4 and 8). 1024 x 4096 keeps mx.quantized_matmul (it won at M = 2
    #   and 4: 42 against 46-49 us). Without the rule batched decode at B = 4 ran 0.52x
    #   bf16 on the Llama-3-8B and Qwen2.5-7B shapes (4 layers, part V of the same log).
    # - M = 8-15: the TMA GEMM. At M = 8 a W8A8 kernel won every shape's race (the table
    #   holds it for each: the TMA GEMM at 1.15-2.43x mx.quantized_matmul, within 1.07x
    #   of the GEMV where that won); M = 9-15 lies between that and M = 16. Without the
    #   rule an H100 (no table of its own) ran batched decode at B = 8 through
    #   mx.quantized_matmul: 0.86x bf16 on 32 layers (bench/results/h100_2026-12-05_f.log,
    #   part Q). The rule has not been timed in a model yet.
    # - M >= 16, every shape: a W8A8 kernel (M = 16: 1.10-2.44x mx.quantized_matmul,
    #   M = 64: 1.44-3.00x, M = 128: 1.51-4.26x; the prefill check on all 32 layers kept
    #   every one it checked against mx.quantized_matmul in the model's prefill at T = 16,
    #   64, 128, 512, 2048, and the sibling check kept q+k+v and gate+up as one launch at
    #   each of them. Re-measured: 1.31-2.63x, 1.66-3.50x and 1.74-4.39x, the prefill
    #   check as before, the sibling check leaving the groups' members alone at M = 128).
    ("cuda", "linear", "per_channel"): [
        (2, 4, 4096 * 4096, ("cuda_int8_gemv", "cuda_w8a8_gemm_tma", "cuda_w8a8_gemm_ws",
                             "cuda_w8a8_gemm")),
        (5, 7, 4096 * 4096, ("cuda_w8a8_gemm_tma", "cuda_w8a8_gemm_ws", "cuda_w8a8_gemm")),
        (8, 15, 0, ("cuda_w8a8_gemm_tma", "cuda_w8a8_gemm_ws", "cuda_w8a8_gemm")),
        (16, 127, 0, ("cuda_w8a8_gemm_ws", "cuda_w8a8_gemm_tma", "cuda_w8a8_gemm")),
        (128, None, 0, ("cuda_w8a8_gemm_tma", "cuda_w8a8_gemm_ws", "cuda_w8a8_gemm")),
    ],
    # CUDA, group-wise 8-bit weights (mlx-lm 8-bit checkpoints), measured on an NVIDIA
    # H200 (MLX 0.32.4, bf16, group size 64): tune --model llama-3-8b --format grouped at
    # M = 16, 128, 512, 2048 (bench/results/h200_2026-12-05_c_tune_g64.log, which
    # tests/test_prior.py checks these rules against; its entries were shipped until
    # the kernels below won their buckets on an H100).
    # - M >= 128: the group-wise TMA GEMM won every shape (1.17-2.50x
    #   mx.quantized_matmul; 0.32-0.46x the per-channel TMA GEMM's speed on the large
    #   shapes at M = 2048, docs/cuda.md).
    # - M = 16: mx.quantized_matmul, the W8A8 GEMV or the TMA GEMM won by shape (a race
    #   without the tensor-core GEMV; its rule below).
    # Batched decode sizes, measured on an NVIDIA H100 80GB HBM3 (same versions): tune
    # --model llama-3-8b --format grouped --group-size 64 --m 2,4,8,16,32,64 (part X of
    # bench/results/h100_2026-12-05_f.log, entries kept in h100_2026-12-05_f_table.json,
    # which tests/test_prior.py checks these rules against). Not yet timed in a model.
    # - M = 2-8: the W8A8 GEMV (at M = 2 and 4 it won all 6 shapes from 4096 x 4096,
    #   1.06-3.15x mx.quantized_matmul; at M = 8 it won 5 of 7, 1.04-2.80x, and took at
    #   most 1.10x the winner's time on the other 2), except for weights below 4096 x 4096
    #   at M = 2-7: 1024 x 4096 kept mx.quantized_matmul there (it won at M = 2 and 4).
    #   A race of every candidate at M = 8 with the tensor-core GEMV in it (part SMF of
    #   bench/results/h100_2026-12-07_h.log, kept in h100_2026-12-07_h_small_m.json) had
    #   that GEMV fastest on all 7 (0.80-0.98x the dp4a GEMV's time): it runs at M = 8 for
    #   group sizes 64 and 128, the dp4a GEMV for 32.
    # - M = 9-32 (and 8, above): the tensor-core GEMV (cuda_int8_gemv_mma, group sizes
    #   64 and 128; not in that tune). A race of every candidate at M = 16 on an NVIDIA H100 (tune --model
    #   llama-3-8b --format grouped --group-size 64 --m 16, checks off; part MMA of
    #   bench/results/h100_2026-12-07_h.log, entries kept as h100_2026-12-07_h_small_m.json,
    #   which tests/test_prior.py checks this rule against) had it fastest on all 7 shapes,
    #   1.03-2.49x mx.quantized_matmul and 0.77-0.97x the next kernel's time. Before it
    #   (the tune above) the GEMV, mx.quantized_matmul and the TMA GEMM each took 1.33x
    #   the winner's time or more on some shape. A race at M = 24 (part SMR there, same
    #   file) had it fastest on 5 of 7 and within 1.07x of the winner (the subnormal GEMM
    #   or the dequantizing GEMM) on the other 2. Group size 32: no rule.
    # - M = 32 (four token tiles, as M = 25-31; two row tiles a block there since
    #   gemv.mma_row_tiles): the tensor-core GEMV. A race of every candidate at M = 32
    #   (part SMQ, same file) had it fastest on 4 of 7 and at most 1.32x the winner's time
    #   on the others (the lm_head, 362 against the subnormal GEMM's 273 us); over a
    #   Llama-3-8B block's launches (q+k+v, o, gate+up, down) it took 274 us against the
    #   subnormal GEMM's 285 and the group-wise TMA GEMM's 324, the rule before.
    # - M = 33-127: the subnormal GEMM (bfloat16 activations), then the group-wise TMA GEMM.
    #   It was faster than the TMA GEMM on all 7 shapes at M = 32 (0.75-0.97x its time,
    #   part SMQ) and the fastest kernel on all 7 at M = 128 (part SPR, below); the races
    #   at M = 32 and 64 before it existed (part X) had the TMA GEMM win 6 of 7 and 7 of 7
    #   (1.07-2.10x mx.quantized_matmul at 64), measured before its tile skipped idle
    #   warps at M = 17-112 (tiles.grouped_tma_tile_for).
    # Prefill sizes, measured on an NVIDIA H100 80GB HBM3 with the dequantizing GEMM on
    # TMA and the dequantize-then-matmul kernel in the race: tune --model llama-3-8b
    # --format grouped --group-size 64 --m 2048,512,128 (part DQR of
    # bench/results/h100_2026-12-05_f.log; its entries were kept in
    # h100_2026-12-05_f_table.json until later races replaced them; their picks stay the
    # rules' fallbacks where the subnormal GEMM refuses the activations).
    # - M >= 512, weights from 4096 x 4096: cuda_dequant_gemm (no float copy of the
    #   weight). At M = 512 it won 5 of these 6 shapes and took 1.09x the winner's time
    #   (cuda_dequant_matmul) on q+k+v; at M = 2048 it won 2 and took at most 1.05x
    #   cuda_dequant_matmul's time on the other 4, whose float weight the model then does
    #   not hold (4 layers at T = 2048: 3.52 GiB of working memory with the race's table,
    #   which took cuda_dequant_matmul there, against bf16's 1.1 GiB).
    # - M >= 512, smaller weights (k and v, 1024 x 4096): cuda_dequant_matmul, the race's
    #   winner at 512 and 2048 (cuda_dequant_gemm took 1.20x / 1.07x its time).
    # - M = 128: the dequantizing GEMM won 4 of 7 shapes by up to 1.15x, the group-wise
    #   TMA GEMM (the rules' fallback below M = 512) 2 by up to 1.22x, and it took at
    #   most 1.15x the winner's time on all 7.
    # The same race again with the subnormal promotion's pipelined mainloop in it (part
    # SPR; its 21 entries replaced the earlier races' group-wise 8-bit ones in
    # h100_2026-12-05_f_table.json):
    # - M >= 128: cuda_w8a8_gemm_subnormal (bfloat16 activations; the rules' next kernels
    #   for others). At M = 128 it won all 7 shapes (0.82-0.99x the next kernel's time),
    #   at M = 512 6 of 7 (and 1.03x cuda_dequant_matmul's time on 1024 x 4096), at
    #   M = 2048 4 of 7 and at most 1.04x the winner's time on the other 3; it keeps no
    #   float copy of the weight, as the dequantize-then-matmul winners would.
    # - M = 33-127: the subnormal GEMM (above).
    ("cuda", "linear", "grouped"): [
        (2, 7, 4096 * 4096, ("cuda_int8_gemv", "cuda_w8a8_gemm_grouped_tma")),
        (8, 8, 0, ("cuda_int8_gemv_mma", "cuda_int8_gemv", "cuda_w8a8_gemm_grouped_tma")),
        (9, 32, 0, ("cuda_int8_gemv_mma",)),
        (33, 511, 0, ("cuda_w8a8_gemm_subnormal", "cuda_w8a8_gemm_grouped_tma",
                      "cuda_w8a8_gemm_grouped")),
        (512, None, 4096 * 4096, ("cuda_w8a8_gemm_subnormal", "cuda_dequant_gemm",
                                  "cuda_dequant_matmul", "cuda_w8a8_gemm_grouped_tma",
                                  "cuda_w8a8_gemm_grouped")),
        (512, None, 0, ("cuda_w8a8_gemm_subnormal", "cuda_dequant_matmul",
                        "cuda_w8a8_gemm_grouped_tma", "cuda_w8a8_gemm_grouped")),
    ],
    # CUDA, MLX's 4-bit weights (mlx-lm 4-bit checkpoints), measured on an NVIDIA H100
    # 80GB HBM3 (MLX 0.32.4, bf16, group size 64): tune --model llama-3-8b --format
    # grouped4 at M = 128, 512, 2048, at M = 1, 4 (parts F and J of
    # bench/results/h100_2026-12-05_f.log) and at M = 8, 16, 32, 64 (part Z5, checks off);
    # their H100 entries are kept as bench/results/h100_2026-12-05_f_table.json, which
    # tests/test_prior.py checks these rules against. Not measured on an H200.
    # - M = 8-32, group sizes 64 and 128: the tensor-core GEMV on the packed codes
    #   (cuda_w4a8_gemv_mma). Races of every candidate at M = 8, 16 and 24 on an NVIDIA H100
    #   (tune --model llama-3-8b --format grouped4 --group-size 64, checks off; parts SMT
    #   and SMR of bench/results/h100_2026-12-07_h.log, entries kept in
    #   h100_2026-12-07_h_small_m.json, which tests/test_prior.py checks this rule
    #   against): it was fastest on 20 of 21 and took 1.002x the dequantizing GEMM's time
    #   on the 21st (M = 24, 14336 x 4096), 1.18-3.53x mx.quantized_matmul at 4 bits, and
    #   0.59-0.95x the time of the dp4a GEMV at M = 8 and 16 (the rule's fallback there
    #   for group size 32; at 17-32 the 4-bit TMA GEMM). At M = 32 (part SMQ, same file)
    #   it took 0.50-0.96x the 4-bit TMA GEMM's time on all 7 (the rule there before),
    #   fastest on 4, at most 1.19x the dequantizing GEMM's on the other 3. In the 4-layer
    #   model from the 4-bit gs64 checkpoint, batched decode at B = 16 on these rules ran
    #   1.16x bf16 (p25..p75 0.94..1.21) and 4.92x mlx-lm 4-bit (part SMR2).
    # - M = 33-127 (smaller weights to 511, below): the 4-bit TMA GEMM won all 7 shapes at
    #   M = 32 and 64 (1.06-2.22x mx.quantized_matmul at 4 bits), before its tile skipped
    #   idle warps at M = 17-112 (tiles.LIVE_M; not yet timed with 4-bit codes).
    # - Group size 32 at M = 8-16: the 4-bit GEMV. At M = 8 it won all 7 shapes (1.08-2.50x); at M = 16 it
    #   won the four from 1024 x 4096 to 4096 x 14336 (1.10-2.30x) and lost the three wide
    #   ones (N >= 14336, K = 4096) to mx.quantized_matmul (its 87, 120 and, on the
    #   lm_head, 301 us against the GEMV's 99, 153 and 434 us), so that over a block's
    #   launches (Llama-3-8B's q+k+v, o, gate+up, down) it takes 405 us against
    #   mx.quantized_matmul's 518 and the TMA GEMM's 497. In the 4-layer model with
    #   part Z5's table (which keeps mx.quantized_matmul on the three wide ones) batched
    #   decode at B = 16 ran 1.34x bf16, against 0.76x with no rule (part Z4) and 1.12x
    #   with these rules (part Z6; B = 64: 0.92x, against 0.55x with no rule).
    # - M = 2-7: the 4-bit GEMV for weights from 4096 x 4096: at M = 4 it won those 6
    #   shapes (1.50-5.34x), lost 1024 x 4096 (0.88x), which it won at M = 8; in the
    #   4-layer model, batched decode at B = 4 with it ran 1.69x mlx-lm 4-bit and 1.14x
    #   bf16 (part J). M = 2 and 3 lie between M = 4 and M = 1, where it won the weights
    #   from 4096 x 14336 (1.15-1.84x) and tied below.
    # - M = 1: no rule. The GEMV's per-shape wins gave no gain in the model's decode
    #   (1.00x mlx-lm 4-bit, p25 0.96x, with the M = 1, 4, 16 table): decode at batch 1 is
    #   host-bound, as for 8-bit weights.
    # - M >= 128, weights from 4096 x 4096: cuda_dequant_gemm, from the race with the
    #   dequantizing GEMM on TMA (part DQR, tune --format grouped4 --m 2048,512,128, its
    #   entries in h100_2026-12-05_f_table.json in place of parts F's and DQY's): it won
    #   4 of these 6 shapes at M = 128 (on the other 2 it took at most 1.12x the 4-bit TMA
    #   GEMM's time), 5 at 512 (1.05x cuda_dequant_matmul's on q+k+v) and 3 at 2048 (at
    #   most 1.02x cuda_dequant_matmul's on the other 3), with no float copy of
    #   the weight (4 layers at T = 2048 with the race's table: 2.29 GiB of working
    #   memory, 3.96 GiB with cuda_dequant_matmul on every shape, part DQW).
    # - Smaller weights (k and v, 1024 x 4096): the 4-bit TMA GEMM up to M = 511, then
    #   cuda_dequant_matmul (mlx_dequant_matmul won all three M by at most 1.06x).
    ("cuda", "linear", GROUPED4): [
        (2, 7, 4096 * 4096, ("cuda_w4a8_gemv",)),
        (8, 16, 0, ("cuda_w4a8_gemv_mma", "cuda_w4a8_gemv")),
        (17, 32, 0, ("cuda_w4a8_gemv_mma", "cuda_w4a8_gemm_tma")),
        (33, 127, 0, ("cuda_w4a8_gemm_tma",)),
        (128, None, 4096 * 4096, ("cuda_dequant_gemm", "cuda_dequant_matmul",
                                  "cuda_w4a8_gemm_tma")),
        (128, 511, 0, ("cuda_w4a8_gemm_tma",)),
        (512, None, 0, ("cuda_dequant_matmul", "cuda_w4a8_gemm_tma")),
    ],
    # CUDA, the raw ops (mlx_w8a8.int8_matmul, mlx_w8a8.quantize_activation), measured on
    # an NVIDIA H200 (MLX 0.32.4): tune --op int8_matmul / quantize_activation on the
    # Llama-3-8B and Qwen2.5-7B projection shapes (tune --shapes mlp attn) at M = 1, 16,
    # 128, 2048 and the GEMM at M = 512 and 8192 (2026-12-01, the two raw tables that
    # tests/test_prior.py reads from bench/results/); chains of independent
    # launches; tests/test_prior.py checks the rules against both files. Without these
    # rules the ops ran the exact MLX-ops kernel wherever no table decided: 5-28x slower
    # than any of the CUDA GEMMs, 6-12x slower than the CUDA quantize.
    # - int8_matmul: the mma.sync GEMM at M <= 128 (fastest at 23 of 24 points; the TMA GEMM
    #   at 18944 x 3584, M = 128, by 43.0 against 43.1 us); the TMA GEMM for the MLP-sized
    #   weights (>= 50 M elements) from M = 512, for weights from 3584 x 3584 from M = 2048
    #   and from 1024 x 4096 at M = 8192 (0.70-0.97x the next GEMM's time); the mma.sync GEMM
    #   for the smaller weights at M = 512 and 2048 and the cp.async GEMM for 512 x 3584 at
    #   M = 8192 (each fastest or within 2% of the fastest). The M ranges split the
    #   measured M values (1-128 | 512 | 2048 | 8192) between them.
    # - quantize_activation: the CUDA kernel at every point (16 of 16).
    ("cuda", "int8_matmul", "int8"): [
        (1, 128, 0, ("cuda_int8_gemm", "cuda_int8_gemm_ws", "cuda_int8_gemm_tma")),
        (129, 1023, 50_000_000, ("cuda_int8_gemm_tma", "cuda_int8_gemm_ws", "cuda_int8_gemm")),
        (129, 1023, 0, ("cuda_int8_gemm", "cuda_int8_gemm_ws", "cuda_int8_gemm_tma")),
        (1024, 4095, 3584 * 3584, ("cuda_int8_gemm_tma", "cuda_int8_gemm_ws", "cuda_int8_gemm")),
        (1024, 4095, 0, ("cuda_int8_gemm", "cuda_int8_gemm_ws", "cuda_int8_gemm_tma")),
        (4096, None, 1024 * 4096, ("cuda_int8_gemm_tma", "cuda_int8_gemm_ws", "cuda_int8_gemm")),
        (4096, None, 0, ("cuda_int8_gemm_ws", "cuda_int8_gemm", "cuda_int8_gemm_tma")),
    ],
    ("cuda", "quantize_activation", "int8"): [
        (1, None, 0, ("cuda_quantize",)),
    ],
    # CPU (MLX's CPU backend), per-channel: the exact W8A8 kernel was faster than
    # mx.quantized_matmul at every measured shape (tune --shapes mlp at M = 1: 1.51-2.02x;
    # 4x4096x14336: 459 vs 2808 ms) and more accurate (38.4 vs 17.8 dB SQNR vs float64
    # there: MLX's CPU bf16 quantized_matmul accumulates in low precision).
    ("cpu", "linear", "per_channel"): [
        (1, None, 0, (EXACT,)),
    ],
    # CPU, group-wise (mlx-lm 8-bit checkpoints, gs64, bf16): tune --format grouped on
    # 2048 x 2048 and 8192 x 2048 (bench/results/tune_cpu_grouped_2026-12-04.*, checked
    # by tests/test_prior.py): the exact W8A8 kernel 5.3-13.6x faster than
    # mx.quantized_matmul at M = 16 and 128 and 1.16-6.04x at M = 2, 4, 8 (batched
    # decode; 2026-12-05, same file); at M = 1 mx.quantized_matmul (0.92x and 0.55x for
    # exact). M = 9-15 lie between the measured 8 and 16. mlx_dequant_matmul
    # (mx.dequantize, then a float32 matmul here) took 1.16-1.74x exact's time at M = 16
    # and 128 (2026-12-06, same log): no rule.
    # Weights of an lm_head's size (2026-12-08, same files): the exact kernel's cost
    # grows faster than the weight (its float32 copies of the codes), so at M = 2 on
    # 128256 x 2048 it took 9.13 s against mx.quantized_matmul's 4.54 s, while on
    # 32064 x 3072 it still won (1.54 against 1.70 s) and on 49152 x 576 tied with
    # mlx_dequant_matmul (374 against 368 ms, both 1.3x faster than mx.quantized_matmul).
    # At M = 8 on 128256 x 2048 mx.quantized_matmul took 20.9 s, exact 9.88 and
    # mlx_dequant_matmul 9.74 (a tie): mx.quantized_matmul's time grows with each row,
    # exact's barely, so they cross near M = 4. Hence mx.quantized_matmul at M = 2-3 for
    # weights from 2^27 elements (between the 98 M that exact won and the 263 M it lost).
    # With activation groups (act_scales="group": only exact_act_groups of the W8A8
    # kernels runs it) the same shapes (bench/results/tune_cpu_act_groups_2026-12-05.*,
    # checked by tests/test_prior.py): exact_act_groups 5.9-14.5x mx.quantized_matmul at
    # M = 16 and 128; at M = 1 mx.quantized_matmul for 8192 x 2048 (exact_act_groups
    # 1.66x its time) and a tie for 2048 x 2048 (1.05x the other way): the rule keeps
    # mx.quantized_matmul there. The 4-bit rule below likewise (same file): 6.0-14.3x at
    # M = 16 and 128; at M = 1 mx.quantized_matmul at 4 bits (exact_act_groups 1.52x and
    # 1.86x its time). With activation groups M = 2-15 was not measured: the M = 2-15
    # rules name only the token-scale kernel, so such layers keep the fallback there.
    ("cpu", "linear", "grouped"): [
        (1, 1, 0, ("mlx_qmm",)),
        (2, 3, 1 << 27, ("mlx_qmm",)),
        (2, 15, 0, (EXACT,)),
        (16, None, 0, (EXACT, EXACT_ACT_GROUPS)),
    ],
    # CPU, MLX's 4-bit weights (mlx-lm 4-bit checkpoints, gs64, bf16): tune --format
    # grouped4 on 2048 x 2048 and 8192 x 2048 (bench/results/tune_cpu_grouped4_2026-12-04.*,
    # checked by tests/test_prior.py): the exact W4A8 kernel 6.2-18.1x faster than
    # mx.quantized_matmul at 4 bits at M = 16 and 128 and 1.14-5.69x at M = 2, 4, 8
    # (2026-12-05, same file); at M = 1 mx.quantized_matmul (the exact kernel took 1.66x
    # and 1.83x its time). M = 9-15 lie between the measured 8 and 16. mlx_dequant_matmul
    # took 1.15-1.62x exact_w4a8's time at M = 16 and 128 (2026-12-06, same log).
    # Weights of an lm_head's size (2026-12-08, same files), as for 8-bit weights above
    # but sooner: at M = 2 on 128256 x 2048 mx.quantized_matmul took 4.84 s,
    # mlx_dequant_matmul 7.22 and exact_w4a8 11.4; on 32064 x 3072 mlx_dequant_matmul
    # 1.72 s, mx.quantized_matmul 2.03 and exact_w4a8 2.10. At M = 8 on 128256 x 2048
    # exact_w4a8 took 9.90 s, mlx_dequant_matmul 9.73 (a tie), mx.quantized_matmul 19.9.
    # Hence at M = 2-3 mx.quantized_matmul for weights from 2^27 elements and
    # mlx_dequant_matmul from 2^26 (one measured shape each).
    ("cpu", "linear", GROUPED4): [
        (1, 1, 0, (QMM4,)),
        (2, 3, 1 << 27, (QMM4,)),
        (2, 3, 1 << 26, ("mlx_dequant_matmul",)),
        (2, 15, 0, (EXACT_W4A8,)),
        (16, None, 0, (EXACT_W4A8, EXACT_ACT_GROUPS)),
    ],
}


def choose(backend: str, problem: Problem, found: list[Candidate]) -> Candidate | None:
    """The prior's candidate for ``problem`` among ``found`` (those that can run it
    here), or ``None`` when the prior has no rule (the fallback then runs)."""
    rules = RULES.get((backend, problem.op, problem.weight_format))
    if not rules:
        return None
    by_name = {c.name: c for c in found}
    for m_min, m_max, min_weight, names in rules:
        if problem.m < m_min or (m_max is not None and problem.m > m_max):
            continue
        if problem.n * problem.k < min_weight:
            continue
        for name in names:
            if name in by_name:
                return by_name[name]
    return None


__all__ = ["RULES", "choose"]
