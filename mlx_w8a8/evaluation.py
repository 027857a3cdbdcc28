"""Perplexity of a model on token windows, and the model variants it is compared across.

Perplexity is ``exp`` of the mean next-token negative log-likelihood over every
predicted token (:func:`perplexity`). A float folder is evaluated as it is (``float``,
cast to a dtype, bfloat16 by default), with its linear layers on mlx-lm's 8-bit weights
(``w8a16``: ``nn.QuantizedLinear``, 8 bits, group size 64; embeddings stay float) and as
W8A8 (``w8a8``: :func:`mlx_w8a8.quantize` of the cast model), and as W8A8 with activation
groups on mlx-lm's 8-bit weights (``w8a8_act_groups``: one int8 scale per token and group
of 64 features); a W8A8 or mlx-lm 8-/4-bit checkpoint as W8A8, with activation groups,
and as stock mlx-lm loads it (``w8a16``) (:func:`load_variant`). W8A8 layers run the
exact W8A8 math unless another W8A8 candidate is named: the tuner's default may run
``mlx_qmm``, which is W8A16.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable

import mlx.core as mx
import mlx.nn as nn

from .nn import Linear
from .sensitivity import EXACT
from .weight import describe

VARIANTS = ("float", "w8a16", "w8a8", "w8a8_act_groups")
DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}


def perplexity(
    model: nn.Module, data: Iterable[mx.array], progress: str | None = None
) -> tuple[float, int]:
    """Perplexity of ``model`` on token windows.

    Args:
        model: called as ``model(tokens)`` -> ``[B, T, V]`` logits.
        data: ``[B, T]`` int token windows (each row predicts its tokens 1..T-1).
        progress: a tqdm description, or ``None``.

    Returns:
        ``(perplexity, predicted tokens)``.

    Raises:
        ValueError: when ``data`` holds no window, or a batch that is not a ``[B, T]``
            integer array with ``T >= 2`` (a window of one token predicts nothing).
    """
    op = "mlx_w8a8.perplexity"
    total, count = mx.array(0.0), 0
    if progress is not None:
        from tqdm import tqdm

        data = tqdm(data, desc=progress, unit="batch")
    for batch in data:
        if not isinstance(batch, mx.array) or batch.ndim != 2 or batch.shape[1] < 2 or (
            not mx.issubdtype(batch.dtype, mx.integer)
        ):
            raise ValueError(
                f"[{op}] each batch must be a [B, T] integer array of token windows with "
                f"T >= 2, got {describe(batch)}"
            )
        logits = model(batch[:, :-1]).astype(mx.float32)
        nll = nn.losses.cross_entropy(logits, batch[:, 1:], reduction="sum")
        total = total + nll
        mx.eval(total)
        count += batch[:, 1:].size
    if count == 0:
        raise ValueError(f"[{op}] data is empty; give at least one window")
    return math.exp(total.item() / count), count


def use_kernel(model: nn.Module, kernel: str | None) -> int:
    """Force ``kernel`` on every :class:`mlx_w8a8.Linear` of ``model``; returns how many.
    ``EXACT`` means each layer's exact math: ``exact_w4a8`` on MLX's 4-bit weights
    (``registry.exact_name``)."""
    from .kernels import registry

    n = 0
    for _, m in model.named_modules():
        if isinstance(m, Linear):
            m.kernel = registry.exact_name(m.problem(1)) if kernel == EXACT else kernel
            n += 1
    return n


def load_variant(
    folder: str | Path, variant: str, kernel: str | None = EXACT, dtype: str = "bfloat16"
):
    """Load ``folder`` as one of :data:`VARIANTS`.

    Args:
        folder: a float mlx-lm folder, or a checkpoint written by :func:`mlx_w8a8.save`.
        variant: ``"float"`` (float folders only), ``"w8a16"`` (linear layers on
            mlx-lm's 8-bit weights, or the checkpoint as stock mlx-lm loads it),
            ``"w8a8"`` or ``"w8a8_act_groups"`` (the W8A8 layers of the checkpoint, or of
            the float folder's mlx-lm 8-bit form, with ``act_scales="group"``).
        kernel: the W8A8 candidate forced on W8A8 layers (default: the exact math).
        dtype: a float folder's model is cast to it first (a key of :data:`DTYPES`).

    Returns:
        The model.
    """
    from mlx_lm.utils import load_model

    from .checkpoint import load
    from .quantizer import quantize

    op = "mlx_w8a8.eval"
    if variant not in VARIANTS:
        raise ValueError(f"[{op}] variant must be one of {VARIANTS}, got {variant!r}")
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    quantized = "quantization" in config
    if dtype not in DTYPES:
        raise ValueError(f"[{op}] dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if variant == "float" and quantized:
        raise ValueError(
            f"[{op}] {folder} is a quantized checkpoint; the float variant needs the float "
            f"model folder"
        )
    if not quantized:
        model = load_model(folder)[0]
        model.set_dtype(DTYPES[dtype])
        if variant == "float":
            return model
    if variant in ("w8a16", "w8a8_act_groups"):
        if quantized:
            model = (load(folder, act_scales="group")[0] if variant == "w8a8_act_groups"
                     else load_model(folder)[0])
        else:
            nn.quantize(
                model, group_size=64, bits=8,
                class_predicate=lambda p, m: isinstance(m, nn.Linear) and m.weight.shape[-1] % 64 == 0,
            )
            if variant == "w8a8_act_groups":
                quantize(model, act_scales="group")
        if variant == "w8a8_act_groups":
            use_kernel(model, kernel)
        return model
    # A float folder is quantized here; a checkpoint loads its W8A8 layers (a stock
    # mlx-lm 8-bit one: all of its 8-bit layers, on the grouped W8A8 math).
    model = quantize(model) if not quantized else load(folder)[0]
    use_kernel(model, kernel)
    return model
