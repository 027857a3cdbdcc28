"""What a converted model will run: per layer, the kernel and where the decision came
from (forced, a tuning table, a borrowed nearby shape, the built-in prior, or the
fallback ``mx.quantized_matmul``), at decode and prefill token counts."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import mlx.nn as nn

from .moe import expert_layers
from .nn import Linear

# Token counts the summary resolves: one decode step and a typical prefill chunk.
SUMMARY_M = (1, 512)


def decisions(
    model: nn.Module, m: int, dtype: mx.Dtype | None = None
) -> dict[str, tuple[str, str]]:
    """``{path: (kernel, source)}`` for every :class:`mlx_w8a8.Linear` of ``model`` at
    ``m`` tokens.

    Args:
        model: a model converted by :func:`mlx_w8a8.quantize`.
        m: the token count (rows of the activation).
        dtype: the activation dtype; default: each layer's scales' dtype (the model's).
    """
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"[mlx_w8a8.decisions] m must be a positive int, got {m!r}")
    return {
        path: layer.decision(m, dtype if dtype is not None else layer["scales"].dtype)
        for path, layer in model.named_modules()
        if isinstance(layer, Linear)
    }


def summary(model: nn.Module, m: tuple[int, ...] = SUMMARY_M, dtype: mx.Dtype | None = None) -> str:
    """One line: how many W8A8 layers, and per token count which kernels run how often
    with the source of each decision, e.g. ``"mlx_w8a8: 224 layers (224 per_channel);
    M=1: cuda_int8_gemv x196 (table), mlx_qmm x28 (fallback); M=512: ..."`` (a 4-bit
    model's layers read ``"224 grouped4 (4-bit)"``; layers with ``act_scales="group"``
    are counted as ``"; 224 with activation groups"``, layers with outlier channels as
    ``"; 224 with outlier channels"``), ending with
    how many mixture-of-experts expert layers were not converted where there are any."""
    layers = [layer for _, layer in model.named_modules() if isinstance(layer, Linear)]
    experts = len(expert_layers(model))
    # Experts hold most of an MoE model's weights: the line says they are not W8A8.
    left = f"; {experts} mixture-of-experts expert layers not converted" if experts else ""
    if not layers:
        return "mlx_w8a8: no mlx_w8a8.Linear layers" + left
    formats = Counter((layer.format, layer.bits) for layer in layers)
    grouped_acts = sum(layer.act_scales == "group" for layer in layers)
    split = sum(layer.outliers is not None for layer in layers)
    parts = [
        f"mlx_w8a8: {len(layers)} layers ("
        + ", ".join(f"{n} {fmt}" + (f" ({bits}-bit)" if bits != 8 else "")
                    for (fmt, bits), n in sorted(formats.items()))
        + (f"; {grouped_acts} with activation groups" if grouped_acts else "")
        + (f"; {split} with outlier channels" if split else "") + ")"
    ]
    for rows in m:
        counts = Counter(decisions(model, rows, dtype).values())
        runs = ", ".join(
            f"{name} x{n} ({source})"
            for (name, source), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        parts.append(f"M={rows}: {runs}")
    return "; ".join(parts) + left
