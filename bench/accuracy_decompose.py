"""Where W8A8's perplexity loss comes from: each linear layer's weights and inputs
quantized apart, in float simulation (quantize-dequantize in MLX ops, float32), on a
fetched model (``python -m mlx_w8a8.fetch``) and local texts.

A variant is a ``+``-joined list of parts, applied in this order:

- ``smooth``: the recipe's SmoothQuant search (``mlx_w8a8.recipe.recipe`` with
  ``grid=GRID, outliers=0``: a strength per site, calibrated on ``--calibration``, as the
  recipe chose it before outlier channels), folded into the float model;
  ``aX`` (``a0.5``): SmoothQuant with one strength ``X`` everywhere instead.
- ``gptq``: per-channel int8 weights rounded with GPTQ error feedback (Frantar et al.;
  the Hessian ``X^T X`` of each layer's calibration inputs, 1% damping, columns in
  decreasing ``diag(H)`` order) instead of round-to-nearest.
- ``wpc``: per-channel symmetric int8 weights (``mlx_w8a8``'s per-channel format);
  ``wg``: group-wise affine 8-bit weights, group 64 (mlx-lm's).
- ``atok``: inputs quantized per token to int8 (the W8A8 activations); ``agN``: per
  token and group of ``N`` features (activation groups).
- ``outN``: the ``N`` input channels of each layer with the largest calibration maxima
  kept out of the int8 activations (zeroed there, their share computed in float
  against the float weight columns), the mixed decomposition of LLM.int8() with the
  channels fixed at calibration.

``float`` is the model as it is. ``lm_head`` stays float in every variant. Each variant
prints one JSON line (perplexity per text).

    python bench/accuracy_decompose.py --model smollm2 --texts prose.txt code.txt \\
        --variants float,wpc,atok,smooth+wpc+atok,out32+wpc+atok --windows 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_unflatten

from accuracy_models import text_windows
from mlx_w8a8.evaluation import perplexity

PARTS = ("smooth", "gptq", "wpc", "wg", "atok")


def strength(part: str) -> float | None:
    """The SmoothQuant strength of an ``aX`` part (``a0.5`` -> 0.5), else ``None``."""
    if part[:1] == "a" and part[1:].replace(".", "", 1).isdigit():
        return float(part[1:])
    return None


def int8_rows(x: mx.array, group: int | None = None) -> mx.array:
    """Symmetric int8 quantize-dequantize of each row of ``x`` (or of each group of
    ``group`` features of a row): scale ``max|x| / 127``, codes ``rint`` clipped."""
    shape = x.shape
    if group is not None:
        x = x.reshape(*shape[:-1], shape[-1] // group, group)
    s = mx.max(mx.abs(x), axis=-1, keepdims=True) / 127
    q = mx.clip(mx.round(x / mx.where(s == 0, 1, s)), -127, 127) * s
    return q.reshape(shape)


def grouped8(w: mx.array, group: int = 64) -> mx.array:
    q, s, b = mx.quantize(w, group_size=group, bits=8)
    return mx.dequantize(q, s, b, group_size=group, bits=8)


def gptq_per_channel(w: np.ndarray, x: np.ndarray, damp: float = 0.01,
                     block: int = 128) -> np.ndarray:
    """Per-channel symmetric int8 (row scale ``max|w| / 127``) with GPTQ's error feedback
    on the calibration inputs ``x`` ``[R, K]``; returns the dequantized weight."""
    W = np.array(w, dtype=np.float64)
    n, k = W.shape
    H = np.asarray(x, dtype=np.float64).T @ np.asarray(x, dtype=np.float64)
    s = np.abs(W).max(axis=1) / 127
    s[s == 0] = 1
    dead = np.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    perm = np.argsort(-np.diag(H))
    W, H = W[:, perm], H[perm][:, perm]
    H += damp * np.mean(np.diag(H)) * np.eye(k)
    U = np.linalg.cholesky(np.linalg.inv(H)).T  # upper: H^-1 = U^T U
    Q = np.zeros_like(W)
    for i0 in range(0, k, block):
        i1 = min(i0 + block, k)
        W1, E = W[:, i0:i1].copy(), np.zeros((n, i1 - i0))
        for j in range(i1 - i0):
            q = np.clip(np.rint(W1[:, j] / s), -127, 127) * s
            Q[:, i0 + j] = q
            E[:, j] = (W1[:, j] - q) / U[i0 + j, i0 + j]
            W1[:, j:] -= np.outer(E[:, j], U[i0 + j, i0 + j:i1])
        W[:, i1:] -= E @ U[i0:i1, i1:]
    out = np.empty_like(Q)
    out[:, perm] = Q
    return out


class Simulated(nn.Module):
    """``y = a(x_main) @ w_q^T + x_out @ w_out^T (+ b)``: ``a`` the activation
    quantize-dequantize, ``x_main`` the input with the kept-out channels zeroed."""

    def __init__(self, layer: nn.Linear, weight: mx.array, act, keep_out: mx.array | None):
        super().__init__()
        self.weight = weight
        if "bias" in layer:
            self.bias = layer.bias
        self.act = act
        self.keep_out = keep_out
        if keep_out is not None:
            self.w_out = layer.weight[:, keep_out]
            mask = mx.ones((layer.weight.shape[1],), dtype=layer.weight.dtype)
            mask[keep_out] = 0
            self.mask = mask

    def __call__(self, x: mx.array) -> mx.array:
        out = None
        if self.keep_out is not None:
            out, x = x[..., self.keep_out], x * self.mask
        if self.act is not None:
            x = self.act(x)
        y = x @ self.weight.T
        if out is not None:
            y = y + out @ self.w_out.T
        return y + self.bias if "bias" in self else y


def build(folder: Path, variant: str, calib: list[mx.array]) -> nn.Module:
    from mlx_lm.utils import load_model

    from mlx_w8a8.calibrate import calibrate
    from mlx_w8a8.recipe import GRID, capture, recipe
    from mlx_w8a8.smooth import smooth

    model = load_model(folder)[0]
    model.set_dtype(mx.float32)
    if variant == "float":
        return model
    parts = variant.split("+")
    for p in parts:
        if not (p in PARTS or strength(p) is not None or p[:2] == "ag" and p[2:].isdigit()
                or p[:3] == "out" and p[3:].isdigit()):
            raise ValueError(f"[accuracy_decompose] unknown part {p!r} in {variant!r}")
    if "smooth" in parts:
        # the strength search as the recipe ran it before outlier channels (it judges
        # layers with their outlier channels kept out unless outliers=0)
        recipe(model, calib, grid=GRID, outliers=0)
    for p in parts:
        if strength(p) is not None:
            smooth(model, calibrate(model, calib), strength(p))
    layers = {p: m for p, m in model.named_modules()
              if type(m) is nn.Linear and not p.endswith("lm_head")}
    weights = {p: m.weight for p, m in layers.items()}
    if "gptq" in parts:
        _, rows = capture(model, calib, rows=1 << 30, layers=list(layers))
        weights = {p: mx.array(gptq_per_channel(np.array(w), rows[p]).astype(np.float32))
                   for p, w in weights.items()}
    elif "wpc" in parts:
        weights = {p: int8_rows(w) for p, w in weights.items()}
    elif "wg" in parts:
        weights = {p: grouped8(w) for p, w in weights.items()}
    act = None
    for p in parts:
        if p == "atok":
            act = int8_rows
        elif p[:2] == "ag":
            act = (lambda g: lambda x: int8_rows(x, g))(int(p[2:]))
    keep_out = {p: None for p in layers}
    for p in parts:
        if p[:3] == "out":
            stats = calibrate(model, calib)
            n = int(p[3:])
            keep_out = {q: mx.array(np.argsort(-np.array(stats[q].absmax))[:n].astype(np.int32))
                        for q in layers}
    model.update_modules(tree_unflatten(
        [(p, Simulated(m, weights[p], act, keep_out[p])) for p, m in layers.items()]))
    return model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="float mlx-lm folder (python -m mlx_w8a8.fetch)")
    p.add_argument("--texts", nargs="+", required=True, help="evaluation text files")
    p.add_argument("--variants", required=True, help="comma-separated, e.g. float,wpc+atok")
    p.add_argument("--calibration", default="builtin", help="calibration file or 'builtin'")
    p.add_argument("--windows", type=int, default=16, help="256-token windows per text")
    p.add_argument("--bos", action="store_true", help="start every window with BOS (Gemma)")
    p.add_argument("--json", help="append results as JSON lines")
    args = p.parse_args(argv)
    folder = Path(args.model)
    data, calib = text_windows(folder, args.texts, 256, args.windows, args.calibration, 4,
                               args.bos)
    for variant in args.variants.split(","):
        start = time.time()
        model = build(folder, variant, calib)
        row = {"model": folder.name, "variant": variant, "windows": args.windows}
        for text, windows in data.items():
            row[Path(text).name] = round(perplexity(model, windows)[0], 4)
        row["seconds"] = round(time.time() - start, 1)
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
        del model
        mx.clear_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
