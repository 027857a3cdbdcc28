"""The built-in prior: which kernel family runs a ``linear`` when no table decides.

Used only when no tuning-table entry (any layer) and no borrowed decision from a nearby
measured shape exists. Each rule comes from a recorded measurement, cited beside it;
where nothing was measured the prior says nothing and ``mx.quantized_matmul``
(``mlx_qmm``) runs, as in stock MLX.

A rule is ``(m_min, m_max, min_weight, names)``: for ``m_min <= M <= m_max`` (``None`` =
no upper bound) and weights of at least ``min_weight`` elements (``N * K``) the first of
``names`` that can run the problem on this machine is used.
"""

from __future__ import annotations

from ..kernels.registry import EXACT, Candidate, Problem

Rule = tuple[int, "int | None", int, tuple[str, ...]]

RULES: dict[tuple[str, str, str], list[Rule]] = {
    # CUDA, per-channel weights, measured on an NVIDIA H200 (MLX 0.32.4, bf16): the shipped
    # table mlx_w8a8/tables/nvidia-h200.json (tune --model llama-3-8b, with the sibling
    # groups' summed shapes q+k+v 6144 x 4096 and gate+up 28672 x 4096; twelfth set,
    # bench/results/h200_2026-12-01_s12_c_*); tests/test_prior.py checks that these rules
    # pick the table's kernel family (W8A8 GEMM or mx.quantized_matmul) on every entry at
    # M >= 64. Within the family the rules name the kernel that won most often (the TMA
    # GEMM at M >= 128 on the large weights; where another won, the first named was
    # within 12% of it in that race).
    # - M < 64: no rule, mx.quantized_matmul. Per shape the W8A8 GEMV or GEMM wins on the
    #   MLP and lm_head weights; in the model's own decode loop (the decode check) none
    #   kept a margin, decode being host-bound and a custom kernel launch costing more
    #   host time than a built-in op (docs/cuda.md).
    # - M >= 64, weights of at least 14336 x 4096 / 2 elements (the MLP projections, the
    #   gate+up group, lm_head): a W8A8 GEMM (1.1-2.1x mlx_qmm at M = 64; the fourth set's
    #   table, bench/results/h200_2026-11-30_s4_b_*: later sets did not measure M = 64).
    # - M >= 128, weights of at least 4096 x 4096 (q, o, the q+k+v sum, the MLP
    #   projections, lm_head): a W8A8 GEMM (at M = 128 1.06x on q/o and q+k+v, 1.62-4.34x
    #   on the others; the prefill check kept o/q and down_proj against
    #   mx.quantized_matmul, which ran at 0.96x / 0.86x of them in the model's prefill).
    #   k/v (1024 x 4096) stay on mlx_qmm up to M = 512.
    # - M >= 2048: every shape (k/v alone too, 1.37x).
    ("cuda", "linear", "per_channel"): [
        (64, 127, 14336 * 4096 // 2, ("cuda_w8a8_gemm_ws", "cuda_w8a8_gemm")),
        (128, None, 4096 * 4096, ("cuda_w8a8_gemm_tma", "cuda_w8a8_gemm_ws", "cuda_w8a8_gemm")),
        (2048, None, 0, ("cuda_w8a8_gemm_tma", "cuda_w8a8_gemm_ws", "cuda_w8a8_gemm")),
    ],
    # CPU (MLX's CPU backend), per-channel: the exact W8A8 kernel was faster than
    # mx.quantized_matmul at every measured shape (tune --shapes mlp at M = 1: 1.51-2.02x;
    # 4x4096x14336: 459 vs 2808 ms) and more accurate (38.4 vs 17.8 dB SQNR vs float64
    # there: MLX's CPU bf16 quantized_matmul accumulates in low precision).
    ("cpu", "linear", "per_channel"): [
        (1, None, 0, (EXACT,)),
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
