"""The built-in prior: which kernel family runs a ``linear`` when no table decides.

Used only when no tuning-table entry (any layer) and no borrowed decision from a nearby
measured shape exists. Each rule comes from a recorded measurement, cited beside it;
where nothing was measured the prior says nothing and ``mx.quantized_matmul``
(``mlx_qmm``) runs, as in stock MLX.

A rule is ``(m_min, m_max, names)``: for ``m_min <= M <= m_max`` (``None`` = no upper
bound) the first of ``names`` that can run the problem on this machine is used.
"""

from __future__ import annotations

from ..kernels.registry import Candidate, Problem

# The exact W8A8 kernel in pure MLX (float32 matmuls on exact K-chunks).
EXACT = "exact"

Rule = tuple[int, "int | None", tuple[str, ...]]

RULES: dict[tuple[str, str, str], list[Rule]] = {
    # CUDA, per-channel weights: the shipped H200 table (tables/nvidia-h200.json, MLX
    # 0.32.4, bf16; Llama-3-8B / Qwen2.5-7B MLP shapes) chose the GEMV at M = 1
    # (1.06-1.29x mlx_qmm), mlx_qmm at M = 16 (the W8A8 GEMM 1.28-1.71x slower there)
    # and the W8A8 GEMM from M = 128 (1.47-3.57x). M between 2 and 127 was not
    # measured except at 16, so mlx_qmm keeps it.
    ("cuda", "linear", "per_channel"): [
        (1, 1, ("cuda_int8_gemv",)),
        (128, None, ("cuda_w8a8_gemm_ws", "cuda_w8a8_gemm")),
    ],
    # CPU (MLX's CPU backend), per-channel: the exact W8A8 kernel was faster than
    # mx.quantized_matmul at every measured shape (tune --shapes mlp at M = 1: 1.51-2.02x;
    # 4x4096x14336: 459 vs 2808 ms) and more accurate (38.4 vs 17.8 dB SQNR vs float64
    # there: MLX's CPU bf16 quantized_matmul accumulates in low precision).
    ("cpu", "linear", "per_channel"): [
        (1, None, (EXACT,)),
    ],
}


def choose(backend: str, problem: Problem, found: list[Candidate]) -> Candidate | None:
    """The prior's candidate for ``problem`` among ``found`` (those that can run it
    here), or ``None`` when the prior has no rule (the fallback then runs)."""
    rules = RULES.get((backend, problem.op, problem.weight_format))
    if not rules:
        return None
    by_name = {c.name: c for c in found}
    for m_min, m_max, names in rules:
        if problem.m < m_min or (m_max is not None and problem.m > m_max):
            continue
        for name in names:
            if name in by_name:
                return by_name[name]
    return None


def describe(backend: str) -> list[str]:
    """Human-readable rules for ``backend`` (for ``--help`` and docs)."""
    out = []
    for (b, op, fmt), rules in RULES.items():
        if b != backend:
            continue
        for m_min, m_max, names in rules:
            upper = "" if m_max is None else f"..{m_max}"
            out.append(f"{op} {fmt} M={m_min}{upper}: {' | '.join(names)}")
    return out


__all__ = ["RULES", "choose", "describe", "EXACT"]
