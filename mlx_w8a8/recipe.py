"""The recommended W8A8 recipe: each layer's largest input channels kept out of the int8
activations, chosen from calibration data, and the layers W8A8 still hurts kept on
W8A16 (SmoothQuant per site on request).

One calibration pass (:func:`capture`) keeps, per linear layer, the per-channel input
maxima and an evenly spaced sample of its input rows (``rows`` of them, float32). Every
later decision is made on those, without running the model again:

1. **Strength per site** (only where ``grid`` holds strengths; the default, ``(None,)``,
   smooths nothing). For each SmoothQuant site (:func:`mlx_w8a8.smooth.groups`) and each
   candidate in ``grid`` (:data:`GRID` is the full search; ``None`` leaves the site
   unsmoothed), the relative W8A8 output error of its consumers, ``sum |y_q - y|^2 / sum
   |y|^2`` over the sampled rows, summed over the consumers; the smallest wins. Each
   linear layer consumes one site, and the per-channel weight quantization of a producer
   (``up_proj``, ``v_proj``) does not change when its rows are scaled, so the choices are
   independent. Smoothing with those strengths (:func:`mlx_w8a8.smooth.smooth`).
2. **Outlier channels.** Each layer's :data:`OUTLIERS` input channels with the largest
   calibration maxima (at most ``K // OUTLIER_SHARE``), which
   :attr:`mlx_w8a8.Linear.outliers` keeps out of the int8 activations
   (:meth:`Recipe.apply`). On SmolLM2-135M and Gemma-3-270M they did what smoothing
   could not: smoothing moves the outliers into the weights, whose per-channel int8
   rounding then costs about as much as it saved (``docs/accuracy.md``).
3. **Mixed policy.** Each quantizable layer's W8A8 and W8A16 SQNR on its sampled rows
   (smoothed, with its outlier channels kept out); layers below ``floor_db`` are kept on
   ``keep`` (W8A16 by default).

The W8A8 error is computed in numpy with the package's W8A8 math (per-token symmetric
int8 activations, ``clip(rint(x / (max|x| / 127)), -127, 127)``; per-channel symmetric
int8 weights, as :class:`mlx_w8a8.Linear` stores them), in float64, so the search costs
a few matrix products per layer rather than forward passes.

Calibration text: a local file, or :func:`builtin_text` (the Python installation's
license, ``import this`` and standard-library module docstrings).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .calibrate import LayerStats, calibrate, linear_layers
from .quantizer import converts_quantized

# Candidate migration strengths of the SmoothQuant search; None leaves a site unsmoothed.
GRID = (None, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# The recipe's default: no smoothing (outlier channels instead).
NO_SMOOTHING = (None,)
# Sampled input rows kept per layer (float32).
ROWS = 256
# Layers whose smoothed W8A8 SQNR on the calibration rows is below this stay on W8A16.
FLOOR_DB = 25.0
# Input channels per layer kept out of the int8 activations (Linear.outliers): those with
# the largest calibration maxima, at most K // OUTLIER_SHARE of them.
OUTLIERS = 32
OUTLIER_SHARE = 16
KEEP = ("w8a16", "float")
BUILTIN = "builtin"

# Standard-library modules whose docstrings are part of the built-in calibration text
# (prose about code, present in every Python installation).
_DOC_MODULES = ("collections", "functools", "itertools", "pathlib", "json", "re", "string",
                "textwrap", "typing", "dataclasses", "datetime", "decimal", "fractions",
                "statistics", "random", "heapq", "bisect", "enum", "logging", "unittest",
                "subprocess", "threading", "asyncio", "contextlib", "inspect", "difflib",
                "email", "http", "urllib", "csv", "sqlite3", "zipfile", "tarfile", "shutil",
                "tempfile", "io", "os", "sys", "math", "operator", "copy", "pickle", "struct")


def builtin_text() -> str:
    """Calibration text every Python installation has: its ``LICENSE.txt`` (when
    installed), the Zen of Python (``import this``) and the docstrings of a fixed list
    of standard-library modules and their public functions and classes."""
    import codecs
    import importlib
    import importlib.util
    import inspect
    import sysconfig

    parts = []
    license_file = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
    if license_file.is_file():
        parts.append(license_file.read_text(errors="replace"))
    # The Zen of Python, read from the module's source: importing it would print it.
    zen = Path(importlib.util.find_spec("this").origin).read_text()
    parts.append(codecs.decode(zen.split('"""')[1], "rot13"))
    for name in _DOC_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        docs = [inspect.getdoc(module) or ""]
        for attr in sorted(getattr(module, "__all__", None) or dir(module)):
            if attr.startswith("_"):
                continue
            obj = getattr(module, attr, None)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                docs.append(inspect.getdoc(obj) or "")
        parts.append("\n\n".join(d for d in docs if d))
    return "\n\n".join(parts)


def builtin_file(folder: str | Path) -> Path:
    """Write :func:`builtin_text` to ``folder/calibration.txt`` and return the path."""
    path = Path(folder) / "calibration.txt"
    path.write_text(builtin_text())
    return path


def calibration_tokens(calibration: str | Path, model_folder: str | Path) -> mx.array:
    """``[T]`` token ids of a calibration text file, or of :func:`builtin_text` when
    ``calibration`` is :data:`BUILTIN` (tokenized with the model folder's tokenizer)."""
    import tempfile

    from .tokens import text_tokens

    if str(calibration) != BUILTIN:
        return text_tokens(calibration, model_folder)
    with tempfile.TemporaryDirectory() as tmp:
        return text_tokens(builtin_file(tmp), model_folder)


def capture(
    model: nn.Module,
    batches: list[mx.array],
    rows: int = ROWS,
    layers: Iterable[str] | None = None,
    progress: bool = False,
) -> tuple[dict[str, LayerStats], dict[str, np.ndarray]]:
    """One calibration pass: input maxima of every linear layer, and evenly spaced
    sampled input rows of ``layers``.

    Args:
        model: the float model (not changed).
        batches: ``[B, T]`` token batches (a list: its size sets the sampling stride).
        rows: about how many rows to sample per layer (the stride is
            ``max(1, tokens // rows)``, from the first token on).
        layers: the paths whose rows are sampled (default: every linear layer).
        progress: show a progress bar.

    Returns:
        ``(stats, {path: [R, K] float32 numpy rows})``.
    """
    batches = list(batches)
    tokens = sum(int(b.size) for b in batches)
    stride = max(1, tokens // max(1, int(rows)))
    want = None if layers is None else set(layers)
    kept: dict[str, list[mx.array]] = {}
    seen: dict[str, int] = {}

    def hook(path, layer, x):
        if want is not None and path not in want:
            return None
        flat = x.reshape(-1, x.shape[-1])
        start = seen.get(path, 0)
        first = (-start) % stride  # global row index start + first is a multiple of stride
        seen[path] = start + flat.shape[0]
        if first >= flat.shape[0]:
            return None
        sample = flat[first::stride].astype(mx.float32)
        kept.setdefault(path, []).append(sample)
        return [sample]

    stats = calibrate(model, batches, hooks=[hook], progress=progress)
    return stats, {p: np.concatenate([np.array(a) for a in v]) for p, v in kept.items()}


def quantize_rows(x: np.ndarray) -> np.ndarray:
    """Per-row symmetric int8 quantize-dequantize (the W8A8 activation math), float64."""
    x = np.asarray(x, dtype=np.float64)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0)
    return np.clip(np.rint(x / scale), -127, 127) * scale


def split_rows(x: np.ndarray, outliers=None) -> np.ndarray:
    """The activations a W8A8 layer with ``outliers`` (channel indices, or ``None``)
    multiplies, float64: the per-token int8 quantize-dequantize of ``x`` with those
    channels zeroed, plus those channels as they are (``mlx_w8a8.Linear.outliers``)."""
    x = np.asarray(x, dtype=np.float64)
    if outliers is None or len(outliers) == 0:
        return quantize_rows(x)
    idx = np.asarray(outliers)
    main = x.copy()
    main[:, idx] = 0.0
    out = quantize_rows(main)
    out[:, idx] = x[:, idx]
    return out


def w8a8_error(x: np.ndarray, w: np.ndarray, outliers=None) -> tuple[float, float]:
    """``(sum y^2, sum (y_q - y)^2)`` of ``y = x w^T`` against W8A8 (per-token int8
    activations, per-channel int8 weights), in float64.

    Args:
        x: ``[R, K]`` inputs.
        w: ``[N, K]`` float weights.
        outliers: input channels kept out of the int8 activations (:func:`split_rows`).
    """
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    y = x64 @ w64.T
    yq = split_rows(x64, outliers) @ quantize_rows(w64).T
    return float(np.sum(y * y)), float(np.sum((yq - y) ** 2))


def a8_error(x: np.ndarray, w: np.ndarray, outliers=None) -> tuple[float, float]:
    """``(sum y^2, sum (y_q - y)^2)`` of ``y = x w^T`` against per-token int8
    activations with the weights as given (a stored quantized layer's dequantized
    weights: the error W8A8 adds to that layer), in float64.

    Args:
        x: ``[R, K]`` inputs.
        w: ``[N, K]`` weights.
        outliers: input channels kept out of the int8 activations (:func:`split_rows`).
    """
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    y = x64 @ w64.T
    yq = split_rows(x64, outliers) @ w64.T
    return float(np.sum(y * y)), float(np.sum((yq - y) ** 2))


def outlier_channels(absmax, count: int = OUTLIERS) -> tuple[int, ...] | None:
    """The ``count`` channels with the largest ``absmax`` (``[K]`` per-channel input
    maxima), at most ``K // OUTLIER_SHARE`` of them, sorted; ``None`` for none."""
    absmax = np.asarray(absmax, dtype=np.float64)
    n = min(int(count), absmax.shape[0] // OUTLIER_SHARE)
    if n <= 0:
        return None
    return tuple(sorted(int(i) for i in np.argsort(-absmax, kind="stable")[:n]))


def stored_layers(model: nn.Module) -> dict[str, nn.QuantizedLinear]:
    """``{path: layer}`` of the ``nn.QuantizedLinear`` layers :func:`mlx_w8a8.quantize`
    converts as stored (MLX affine, 8 or 4 bits, a group size of ``GROUP_SIZES``)."""
    return {p: m for p, m in linear_layers(model).items()
            if isinstance(m, nn.QuantizedLinear) and converts_quantized(m)}


def _dequantized(layer: nn.QuantizedLinear) -> np.ndarray:
    w = mx.dequantize(layer.weight, layer.scales, layer.biases, group_size=layer.group_size,
                      bits=layer.bits)
    return np.array(w.astype(mx.float32), dtype=np.float64)


def w8a16_error(x: np.ndarray, w: mx.array, group_size: int = 64) -> tuple[float, float]:
    """``(sum y^2, sum (y_q - y)^2)`` with mlx-lm's 8-bit affine weights (group-wise,
    float activations), in float64."""
    wq = mx.dequantize(*mx.quantize(w.astype(mx.float32), group_size=group_size, bits=8),
                       group_size=group_size, bits=8)
    x64 = np.asarray(x, np.float64)
    y = x64 @ np.array(w.astype(mx.float32), dtype=np.float64).T
    yq = x64 @ np.array(wq, dtype=np.float64).T
    return float(np.sum(y * y)), float(np.sum((yq - y) ** 2))


def _db(signal: float, noise: float) -> float:
    if noise <= 0:
        return math.inf
    return -math.inf if signal <= 0 else 10.0 * math.log10(signal / noise)


@attrs.define
class Recipe:
    """What :func:`recipe` chose.

    Attributes:
        alphas: ``{producer path: alpha or None}`` per SmoothQuant site.
        site_db: ``{producer path: (W8A8 dB unsmoothed, W8A8 dB chosen)}`` of the site's
            consumers together, on the sampled rows.
        layers: ``{path: {"w8a8_db", "w8a16_db", "k", "n"}}`` after smoothing.
        keep: ``{path: "w8a16" | "float"}``: layers kept off W8A8 (a ``skip`` table).
        floor_db: the floor used.
        tokens: calibration tokens; ``rows``: sampled rows per layer.
        outliers: ``{path: channels}``: each W8A8 layer's input channels kept out of the
            int8 activations (:attr:`mlx_w8a8.Linear.outliers`; :meth:`apply` sets them).
    """

    alphas: dict
    site_db: dict
    layers: dict
    keep: dict
    floor_db: float
    tokens: int
    rows: int
    outliers: dict = attrs.field(factory=dict)

    def apply(self, model: nn.Module) -> int:
        """Set each converted layer's :attr:`mlx_w8a8.Linear.outliers` (call it after
        :func:`mlx_w8a8.quantize`); returns how many layers got some."""
        from .nn import Linear

        done = 0
        for path, layer in model.named_modules():
            channels = self.outliers.get(path)
            if channels and isinstance(layer, Linear):
                layer.outliers = channels
                done += 1
        return done

    def summary(self) -> str:
        """A few lines: strengths chosen, gain, layers kept."""
        chosen = [a for a in self.alphas.values()]
        counts = {}
        for a in chosen:
            counts[a] = counts.get(a, 0) + 1
        order = sorted(counts, key=lambda a: -1.0 if a is None else a)
        hist = ", ".join(f"{'none' if a is None else a}: {counts[a]}" for a in order)
        lines = [f"recipe: {self.tokens} calibration tokens, {self.rows} sampled rows per layer"]
        if any(a is not None for a in chosen):
            gain = [after - before for before, after in self.site_db.values()
                    if math.isfinite(after - before)]
            lines.append(f"recipe: SmoothQuant strength per site ({len(chosen)} sites): {hist}; "
                         f"median gain {np.median(gain) if gain else 0.0:+.1f} dB")
        elif self.alphas:
            lines.append(f"recipe: not smoothed ({len(chosen)} SmoothQuant sites left as they "
                         f"are: the default; grid=GRID searches a strength per site)")
        else:
            lines.append("recipe: not smoothed (no SmoothQuant site whose layers are float: "
                         "the family has none, or its layers are stored quantized)")
        if self.outliers:
            counts = sorted({len(c) for c in self.outliers.values()})
            lines.append(f"recipe: outlier channels kept out of the int8 activations in "
                         f"{len(self.outliers)} layers ({' or '.join(map(str, counts))} "
                         f"input channels each)")
        worst = sorted(self.layers.items(), key=lambda kv: kv[1]["w8a8_db"])[:3]
        lines.append("recipe: lowest W8A8 SQNR: " + ", ".join(
            f"{p} {e['w8a8_db']:.1f} dB" for p, e in worst))
        lines.append(f"recipe: {len(self.keep)} of {len(self.layers)} layers below "
                     f"{self.floor_db:g} dB kept off W8A8: {sorted(self.keep)}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """A JSON-serialisable dict (infinite SQNR written as null)."""
        def clean(v):
            return None if isinstance(v, float) and not math.isfinite(v) else v

        return {
            "tokens": self.tokens, "rows": self.rows, "floor_db": self.floor_db,
            "alphas": self.alphas,
            "site_db": {p: [clean(a), clean(b)] for p, (a, b) in self.site_db.items()},
            "keep": self.keep,
            "outliers": {p: list(c) for p, c in self.outliers.items()},
            "layers": {p: {k: clean(v) for k, v in e.items()} for p, e in self.layers.items()},
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path


def _module(model: nn.Module, path: str) -> nn.Module:
    m = model
    for part in path.split("."):
        m = m[int(part)] if isinstance(m, list) else m[part]
    return m


def recipe(
    model: nn.Module,
    batches: list[mx.array],
    grid: Iterable[float | None] = NO_SMOOTHING,
    floor_db: float = FLOOR_DB,
    keep: str = "w8a16",
    rows: int = ROWS,
    group_size: int = 64,
    progress: bool = False,
    outliers: int = OUTLIERS,
) -> Recipe:
    """Choose the recipe for a model and apply its smoothing in place (none by default);
    returns the choices: the layers to keep off W8A8 in ``.keep`` (pass it as
    ``quantize(skip=...)``) and the outlier channels (``.apply(model)`` after
    ``quantize``).

    Args:
        model: a float mlx-lm model. Families :mod:`mlx_w8a8.smooth` supports are
            smoothed; others only get the mixed policy.
        batches: calibration ``[B, T]`` token batches (a list).
        grid: candidate SmoothQuant strengths per site (``None``: no smoothing at a
            site); :data:`GRID` searches them all. Default: no smoothing.
        floor_db: layers whose smoothed W8A8 SQNR on the sampled rows is below this are
            kept on ``keep``.
        keep: ``"w8a16"`` or ``"float"``.
        rows: sampled input rows per layer.
        group_size: the W8A16 group size (and which layers are quantizable: K divisible).
        progress: show a progress bar for the calibration pass.
        outliers: input channels per layer kept out of the int8 activations
            (:func:`outlier_channels` of the smoothed calibration maxima; 0: none). The
            strengths and the floor are judged with them kept out.

    Raises:
        ValueError: for a bad ``keep``, ``grid`` or ``rows``, or empty ``batches``.
    """
    from .sensitivity import quantizable
    from .smooth import groups, site_factors, smooth

    op = "mlx_w8a8.recipe"
    if keep not in KEEP:
        raise ValueError(f"[{op}] keep must be one of {KEEP}, got {keep!r}")
    grid = list(grid)
    bad = [a for a in grid if a is not None and not (isinstance(a, (int, float)) and 0 <= a <= 1)]
    if not grid or bad:
        raise ValueError(f"[{op}] grid must hold alphas in [0, 1] or None, got {grid!r}")
    if int(rows) < 1:
        raise ValueError(f"[{op}] rows must be >= 1, got {rows!r}")
    if isinstance(outliers, bool) or not isinstance(outliers, int) or outliers < 0:
        raise ValueError(f"[{op}] outliers must be an int >= 0, got {outliers!r}")
    floats = quantizable(model, group_size)
    stored = stored_layers(model)
    try:
        sites = groups(model)
    except ValueError:
        sites = []
    # A site smooths only float layers: stored codes cannot take the column factors,
    # and a down / o site also scales its producer's rows.
    sites = [g for g in sites if all(p in floats for p in g.linears)
             and (g.pair not in ("down", "o") or g.prev in floats)]
    # One sample per distinct input: consumers of a site share theirs.
    source = {p: p for p in [*floats, *stored]}
    for g in sites:
        for p in g.linears:
            source[p] = g.linears[0]
    stats, sample = capture(model, batches, rows, sorted(set(source.values())), progress)
    tokens = next(iter(stats.values())).tokens if stats else 0

    def maxima(path):  # the per-channel input maxima of a layer, float64
        return np.array(stats[path].absmax.astype(mx.float32), dtype=np.float64)

    alphas, site_db, factors_in = {}, {}, {}
    for g in sites:
        x = sample[g.linears[0]]
        weights = [np.array(_module(model, p).weight.astype(mx.float32)) for p in g.linears]
        best, best_err, base_err = None, math.inf, None
        for a in [None] + [a for a in grid if a is not None]:  # None first: ties keep it
            s = np.ones(x.shape[1]) if a is None else np.array(
                site_factors(model, g, stats, a)[1], dtype=np.float64)
            kept_out = outlier_channels(maxima(g.linears[0]) / s, outliers)
            err = 0.0
            for w in weights:
                signal, noise = w8a8_error(x / s, w * s, kept_out)
                err += noise / signal if signal > 0 else 0.0
            if a is None:
                base_err = err
            if err < best_err and (a is not None or None in grid):
                best, best_err = a, err
        alphas[g.prev] = best
        site_db[g.prev] = (_db(1.0, base_err), _db(1.0, best_err))
        if best is not None:  # the consumers' column factors, before the model changes
            s_in = np.array(site_factors(model, g, stats, best)[1], dtype=np.float64)
            for p in g.linears:
                factors_in[p] = s_in
    if sites:
        smooth(model, stats, alphas)

    layers, kept, chosen = {}, {}, {}
    for p, m in floats.items():
        x = sample[source[p]]
        amax = maxima(p)
        if p in factors_in:
            x, amax = x / factors_in[p], amax / factors_in[p]
        chosen[p] = outlier_channels(amax, outliers)
        s8, n8 = w8a8_error(x, np.array(m.weight.astype(mx.float32)), chosen[p])
        s16, n16 = w8a16_error(x, m.weight, group_size)
        layers[p] = {"w8a8_db": _db(s8, n8), "w8a16_db": _db(s16, n16),
                     "k": int(m.weight.shape[1]), "n": int(m.weight.shape[0])}
        if layers[p]["w8a8_db"] < floor_db:
            kept[p] = keep
    for p, m in stored.items():
        chosen[p] = outlier_channels(maxima(p), outliers)
        signal, noise = a8_error(sample[source[p]], _dequantized(m), chosen[p])
        layers[p] = {"w8a8_db": _db(signal, noise), "w8a16_db": math.inf,
                     "k": int(m.weight.shape[1]) * 32 // m.bits,
                     "n": int(m.weight.shape[0]), "bits": int(m.bits)}
        if layers[p]["w8a8_db"] < floor_db:
            kept[p] = "w8a16"  # quantize leaves a matched quantized layer as stored
    chosen = {p: c for p, c in chosen.items() if c and p not in kept}
    return Recipe(alphas, site_db, layers, kept, float(floor_db), tokens,
                  max(len(v) for v in sample.values()) if sample else 0, chosen)
