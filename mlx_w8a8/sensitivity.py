"""Sensitivity report: how much W8A8 and W8A16 cost each layer, and the whole model.

Per linear layer, on the calibration batches: the SQNR of its W8A8 output (per-token int8
activations, the exact W8A8 math) and of its W8A16 output (MLX's 8-bit weights, float
activations) against its float output, all on the float model's own inputs to that layer.
For the whole model: the SQNR of the logits with every layer W8A8 (or W8A16) against the
float logits. The layers with the lowest W8A8 SQNR are the ones a mixed policy keeps on
W8A16 or float (:func:`policy`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable, Mapping

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from .calibrate import calibrate, linear_layers
from .kernels import registry
from .nn import Linear

KEEP = ("w8a16", "float")
# The candidate running the exact W8A8 math of docs/numerics.md on any device.
EXACT = registry.EXACT


def _db(signal: float, noise: float) -> float:
    if noise <= 0:
        return math.inf
    if signal <= 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def w8a8_layer(layer: nn.Linear, group_size: int = 64, per_channel: bool = True,
               kernel: str | None = EXACT) -> Linear:
    """The W8A8 version of a float layer, with ``kernel`` forced (default :data:`EXACT`,
    the exact W8A8 math on any device; ``None``: the tuner's choice, which may be
    ``mlx_qmm``, i.e. W8A16)."""
    out = Linear.from_linear(layer, group_size=group_size, per_channel=per_channel)
    out.kernel = kernel
    return out


def w8a16_layer(layer: nn.Linear, group_size: int = 64) -> nn.QuantizedLinear:
    """The W8A16 version of a float layer: an 8-bit ``nn.QuantizedLinear`` as mlx-lm
    makes it (group-wise affine)."""
    return nn.QuantizedLinear.from_linear(layer, group_size=group_size, bits=8)


def quantizable(model: nn.Module, group_size: int = 64) -> dict[str, nn.Linear]:
    """``{path: layer}`` of the float ``nn.Linear`` layers whose K ``group_size`` divides."""
    return {
        p: m for p, m in linear_layers(model).items()
        if type(m) is nn.Linear and m.weight.shape[-1] % group_size == 0
    }


def logits_sqnr(
    model: nn.Module,
    batches: Iterable[mx.array],
    variants: Mapping[str, Mapping[str, nn.Module]],
    progress: str | None = None,
) -> dict[str, float]:
    """SQNR (dB) of the model's logits with layers replaced, against the model as it is.

    Args:
        model: the float model; restored after each variant's pass.
        batches: token batches.
        variants: ``{name: {path: replacement layer}}``.
        progress: a tqdm description, or ``None``.

    Returns:
        ``{name: dB}``, accumulated as running sums over every batch.
    """
    sums = {name: [mx.array(0.0), mx.array(0.0)] for name in variants}
    originals = linear_layers(model)
    if progress is not None:
        from tqdm import tqdm

        batches = tqdm(batches, desc=progress, unit="batch")
    for batch in batches:
        ref = model(batch).astype(mx.float32)
        for name, replace in variants.items():
            model.update_modules(tree_unflatten(list(replace.items())))
            try:
                got = model(batch).astype(mx.float32)
            finally:
                model.update_modules(tree_unflatten([(p, originals[p]) for p in replace]))
            sums[name][0] = sums[name][0] + mx.sum(ref * ref)
            sums[name][1] = sums[name][1] + mx.sum((got - ref) ** 2)
        mx.eval([a for pair in sums.values() for a in pair])
    return {name: _db(s.item(), n.item()) for name, (s, n) in sums.items()}


@attrs.define
class SensitivityReport:
    """Attributes:
        layers: ``{path: {"w8a8_db", "w8a16_db", "k", "n"}}`` in model order.
        logits: ``{"w8a8_db", "w8a16_db"}``, every quantizable layer replaced.
        tokens: calibration tokens seen.
        group_size: the weight group size used.
    """

    layers: dict[str, dict]
    logits: dict[str, float]
    tokens: int
    group_size: int = 64

    def to_json(self) -> dict:
        """A JSON-serialisable dict (infinite SQNR, an exact output, is written as null)."""
        def clean(v):
            return None if isinstance(v, float) and not math.isfinite(v) else v

        return {
            "tokens": self.tokens,
            "group_size": self.group_size,
            "logits": {k: clean(v) for k, v in self.logits.items()},
            "layers": {p: {k: clean(v) for k, v in e.items()} for p, e in self.layers.items()},
        }

    def save(self, path: str | Path) -> Path:
        """Write :meth:`to_json` to ``path``."""
        path = Path(path)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path

    def table(self, worst: int | None = None) -> str:
        """The report as a text table, lowest W8A8 SQNR first.

        Args:
            worst: show only this many layers (default: all).
        """
        rows = sorted(self.layers.items(), key=lambda kv: kv[1]["w8a8_db"])
        if worst is not None:
            rows = rows[:worst]
        width = max([len("layer")] + [len(p) for p, _ in rows])
        lines = [f"{'layer':<{width}}  {'K':>6} {'N':>6}  {'W8A8 dB':>8}  {'W8A16 dB':>8}"]
        for path, e in rows:
            lines.append(
                f"{path:<{width}}  {e['k']:>6} {e['n']:>6}  {e['w8a8_db']:>8.2f}  {e['w8a16_db']:>8.2f}"
            )
        lines.append(
            f"{'logits (whole model)':<{width}}  {'':>6} {'':>6}  "
            f"{self.logits['w8a8_db']:>8.2f}  {self.logits['w8a16_db']:>8.2f}"
        )
        return "\n".join(lines)


def sensitivity(
    model: nn.Module,
    batches: list[mx.array],
    group_size: int = 64,
    per_channel: bool = True,
    kernel: str | None = EXACT,
    progress: bool = False,
) -> SensitivityReport:
    """Measure the W8A8 and W8A16 error of each linear layer and of the logits.

    Args:
        model: a float model (not changed); called as ``model(batch)``.
        batches: token batches (a list: they are run twice, per layer then per model).
        group_size: weight group size (W8A8 and W8A16). Default: ``64``.
        per_channel: symmetric per-channel int8 W8A8 weights (default) or group-wise.
        kernel: the W8A8 kernel (default :data:`EXACT`, the exact W8A8 math).
        progress: show tqdm progress bars.

    Returns:
        A :class:`SensitivityReport`.

    Raises:
        ValueError: when the model has no quantizable float linear layer.
    """
    floats = quantizable(model, group_size)
    if not floats:
        raise ValueError(
            f"[mlx_w8a8.sensitivity] the model has no float nn.Linear layer with K divisible "
            f"by group_size {group_size}; measure the float model, before quantizing it"
        )
    w8a8 = {p: w8a8_layer(m, group_size, per_channel, kernel) for p, m in floats.items()}
    w8a16 = {p: w8a16_layer(m, group_size) for p, m in floats.items()}
    sums = {p: [mx.array(0.0)] * 3 for p in floats}  # signal, W8A8 noise, W8A16 noise

    def hook(path, layer, x):
        y = layer(x).astype(mx.float32)
        e8 = w8a8[path](x).astype(mx.float32) - y
        e16 = w8a16[path](x).astype(mx.float32) - y
        s = sums[path]
        sums[path] = [s[0] + mx.sum(y * y), s[1] + mx.sum(e8 * e8), s[2] + mx.sum(e16 * e16)]
        return sums[path]

    stats = calibrate(model, batches, layers=list(floats), hooks=[hook], progress=progress)
    layers = {}
    for p, m in floats.items():
        signal, n8, n16 = (a.item() for a in sums[p])
        layers[p] = {
            "w8a8_db": _db(signal, n8), "w8a16_db": _db(signal, n16),
            "k": int(m.weight.shape[1]), "n": int(m.weight.shape[0]),
        }
    logits = logits_sqnr(
        model, batches, {"w8a8_db": w8a8, "w8a16_db": w8a16},
        "logits" if progress else None,
    )
    tokens = next(iter(stats.values())).tokens
    return SensitivityReport(layers, logits, tokens, group_size)


def policy(
    report: SensitivityReport, sqnr_floor: float, keep: str = "w8a16"
) -> dict[str, str]:
    """The layers whose W8A8 SQNR is below ``sqnr_floor`` dB, to keep off W8A8.

    Args:
        report: a :class:`SensitivityReport` of the (smoothed) float model.
        sqnr_floor: the floor in dB.
        keep: ``"w8a16"`` (8-bit weights, float activations) or ``"float"``.

    Returns:
        ``{path: keep}``, to pass (merged with name patterns) as ``quantize(skip=...)``.
    """
    if keep not in KEEP:
        raise ValueError(f"[mlx_w8a8.policy] keep must be one of {KEEP}, got {keep!r}")
    return {p: keep for p, e in report.layers.items() if e["w8a8_db"] < sqnr_floor}
