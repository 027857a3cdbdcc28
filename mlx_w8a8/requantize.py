"""Group-wise layers requantized to symmetric per-channel int8, with what it cost.

An mlx-lm 8-bit or 4-bit checkpoint stores ``w = s_g q + b_g`` per group of 32, 64 or
128 inputs. The per-channel W8A8 kernels (one scale per output row) are the fastest this
package has, so a user who prefers speed to the last bit of fidelity can requantize each
row: dequantize the stored weight (exact in float32) and quantize it again with one
symmetric scale per row. That is a second rounding, and group-wise scales fit a row
better than one scale does, so :func:`per_channel` reports the cost: the weight SQNR of
each layer, the weights' bytes before and after (a 4-bit layer's double: its codes
become 8 bits wide) and, given tokens, the logits SQNR of the model against its
group-wise self.
"""

from __future__ import annotations

import math
from typing import Callable

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map_with_path

from .nn import Linear
from .tuning.render import fmt_bytes
from .weight import QuantizedWeight


@attrs.frozen
class Requantized:
    """What :func:`per_channel` did.

    Attributes:
        weight_sqnr_db: ``{layer path: SQNR}`` in dB of each requantized weight against
            the group-wise weight it replaced (``10 log10(sum w^2 / sum (w - w')^2)``,
            float64 on the host; ``inf`` where nothing changed).
        logits_sqnr_db: the model's logits against the group-wise model's on the tokens
            given, in dB; ``None`` without tokens.
        bytes_before, bytes_after: the requantized layers' weight bytes (codes, scales
            and biases; not the layers' float biases) before and after.
    """

    weight_sqnr_db: dict[str, float]
    logits_sqnr_db: float | None = None
    bytes_before: int = 0
    bytes_after: int = 0

    @property
    def layers(self) -> int:
        return len(self.weight_sqnr_db)

    def describe(self) -> str:
        """One line for a log: how many layers, the worst and median weight SQNR and the
        logits SQNR."""
        if not self.weight_sqnr_db:
            return "no group-wise layers to requantize"
        values = sorted(self.weight_sqnr_db.values())
        median = values[len(values) // 2]
        worst = min(self.weight_sqnr_db, key=self.weight_sqnr_db.get)
        text = (f"{self.layers} group-wise layers requantized to per-channel int8: weight "
                f"SQNR median {median:.1f} dB, worst {values[0]:.1f} dB ({worst}); their "
                f"weights {fmt_bytes(self.bytes_before)} -> {fmt_bytes(self.bytes_after)}")
        if self.logits_sqnr_db is not None:
            text += f"; logits SQNR {self.logits_sqnr_db:.1f} dB against the group-wise model"
        return text


def _nbytes(qw: QuantizedWeight) -> int:
    return sum(a.nbytes for a in (qw.q, qw.scales, qw.biases) if a is not None)


def _sqnr_db(ref, new) -> float:
    import numpy as np

    ref = np.asarray(ref, dtype=np.float64)
    err = float(np.sum((ref - np.asarray(new, dtype=np.float64)) ** 2))
    sig = float(np.sum(ref ** 2))
    if err == 0.0:
        return math.inf
    return 10.0 * math.log10(sig / err) if sig > 0 else -math.inf


def _requantize(old: QuantizedWeight):
    """``old`` as a symmetric per-channel int8 weight whose scales keep ``old``'s dtype;
    the codes are rounded from the float32 weight against the stored scale (so the
    weight is rounded once, not first to the scales' dtype).

    Returns:
        ``(new weight, old float32 weight, new float32 weight)``; the float32 weights
        are what the W8A8 kernels multiply by (``s_g q + b_g`` and ``s_n w_i8``, exact
        in float32), not ``dequantize()``'s rounding to the scales' dtype.
    """
    s, b = old.scales.astype(mx.float32), old.biases.astype(mx.float32)
    n, k = old.shape
    codes = old.codes().astype(mx.float32).reshape(n, -1, old.group_size)
    w = (codes * s[..., None] + b[..., None]).reshape(n, k)
    scale = (mx.max(mx.abs(w), axis=1, keepdims=True) / 127.0).astype(old.scales.dtype)
    sf = scale.astype(mx.float32)
    w_i8 = mx.clip(mx.round(w / mx.where(sf > 0, sf, 1.0)), -127, 127)
    new = QuantizedWeight.from_int8(w_i8.astype(mx.int8), scale, old.group_size)
    return new, w, w_i8 * sf


def per_channel(
    model: nn.Module,
    tokens: mx.array | None = None,
    class_predicate: Callable[[str, Linear], bool] | None = None,
) -> Requantized:
    """Requantize the group-wise :class:`mlx_w8a8.Linear` layers of ``model`` (8-bit
    and 4-bit codes) to symmetric per-channel int8, in place.

    Each weight is dequantized in float32 (``s_g q + b_g``, as the group-wise kernels
    compute it) and quantized with one scale per row, ``s_n = max_k |w_nk| / 127``,
    stored in the scales' dtype, in MLX's affine 8-bit layout: an 8-bit layer keeps its
    memory size, a 4-bit layer's weight doubles (the report says by how much), and stock
    mlx-lm loads a saved copy as 8-bit layers. Sibling groups (q/k/v, gate/up) are
    linked again, since the members' format changed.

    Args:
        model: a model whose layers were converted by :func:`mlx_w8a8.quantize` or
            :func:`mlx_w8a8.load`.
        tokens: ``[B, T]`` token ids; if given, the model's logits on them are compared
            before and after (one forward pass each; ``model(tokens)`` must return
            logits).
        class_predicate: ``(path, layer) -> bool``; only layers where it is true are
            requantized. Default: every group-wise layer (``format`` ``"grouped"`` or
            ``"grouped4"``); e.g. ``lambda p, l: l.format == "grouped"`` keeps the 4-bit
            layers as they are.

    Returns:
        A :class:`Requantized` report.

    Raises:
        ValueError: for ``tokens`` of the wrong form, or a chosen layer with activation
            groups (``act_scales="group"``); the model is left as it was.
    """
    from . import siblings

    if tokens is not None and (not isinstance(tokens, mx.array) or tokens.ndim != 2):
        raise ValueError(
            f"[mlx_w8a8.requantize.per_channel] tokens must be a [B, T] array of token ids, "
            f"got {type(tokens).__name__}{getattr(tokens, 'shape', '')}"
        )
    before = None
    if tokens is not None:
        before = model(tokens).astype(mx.float32)
        mx.eval(before)
    report: dict[str, float] = {}
    sizes = [0, 0]

    def convert(path, layer):
        if not isinstance(layer, Linear) or layer.format not in ("grouped", "grouped4"):
            return layer
        if class_predicate is not None and not class_predicate(path, layer):
            return layer
        if layer.act_scales != "token":  # raised before the model is updated: nothing changes
            raise ValueError(
                f"[mlx_w8a8.requantize.per_channel] {path} scales its activations per weight "
                f"group (act_scales='group'), which per-channel weights cannot; set its "
                f"act_scales to 'token' first, or leave it out with class_predicate"
            )
        old = layer.quantized_weight
        new, w, w_new = _requantize(old)
        report[path] = _sqnr_db(w, w_new)
        sizes[0] += _nbytes(old)
        sizes[1] += _nbytes(new)
        out = Linear.from_weight(new, layer["bias"] if "bias" in layer else None)
        # What the layer was set to run with stays: its forced kernel and the outlier
        # channels a recipe chose (their share is computed from the new weight's columns).
        if layer.kernel is not None:
            out.kernel = layer.kernel
        out.outliers = layer.outliers
        return out

    leaves = tree_map_with_path(convert, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)
    if report:
        siblings.link(model)
    logits = None
    if before is not None:
        after = model(tokens).astype(mx.float32)
        logits = _sqnr_db(before, after)
    return Requantized(dict(sorted(report.items())), logits, sizes[0], sizes[1])
