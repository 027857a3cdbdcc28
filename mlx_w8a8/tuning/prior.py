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
    # CUDA, per-channel weights, measured on an NVIDIA H200 (MLX 0.32.4, bf16):
    # - M <= 64: no rule, mx.quantized_matmul. The tuner times the W8A8 GEMV faster at
    #   M = 1..4 for large weights in isolation (bench/results/
    #   h200_2026-11-30_tune_llama3_8b.json), but a 4-layer Llama-3-8B decoded at
    #   0.74-0.79x mlx-lm 8-bit with the GEMV on its MLP / lm_head layers and at 1.07x
    #   with mx.quantized_matmul everywhere (h200_2026-11-30_decode_*.log): decode there
    #   is bound by the per-launch cost of the custom kernels, not by weight bandwidth.
    #   M = 8..64: mx.quantized_matmul was fastest on every Llama-3-8B shape.
    # - M >= 128: the W8A8 GEMM (1.34-4.6x mlx_qmm from M = 128 on the MLP shapes; a
    #   4-layer Llama-3-8B prefilled 1.50x / 2.23x / 3.48x mlx-lm 8-bit at T = 128 /
    #   512 / 2048 with this rule, h200_2026-11-30_model_untuned.log).
    ("cuda", "linear", "per_channel"): [
        (128, None, 0, ("cuda_w8a8_gemm",)),
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
