"""Whole models: ``quantize`` in place, ``save`` and ``load`` checkpoints.

A checkpoint is a folder holding ``model.safetensors`` and ``config.json``. W8A8 layers
are stored in MLX's affine 8-bit layout under the parameter names of
``nn.QuantizedLinear``, and ``config.json`` carries the standard ``"quantization"``
entry, so stock mlx-lm loads the folder as an ordinary 8-bit model. The ``"mlx_w8a8"``
entry lists the W8A8 layers so :func:`load` brings them back as :class:`Linear`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path

from .nn import Linear
from .weight import GROUP_SIZES

CONFIG_KEY = "mlx_w8a8"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def _convertible(layer: nn.Module, group_size: int) -> bool:
    if isinstance(layer, nn.QuantizedLinear):
        return layer.bits == 8 and getattr(layer, "mode", "affine") == "affine"
    if isinstance(layer, nn.Linear):
        return layer.weight.shape[-1] % group_size == 0
    return False


def quantize(
    model: nn.Module,
    class_predicate: Callable[[str, nn.Module], bool] | None = None,
    group_size: int = 64,
    per_channel: bool = True,
) -> nn.Module:
    """Replace linear layers of ``model`` by :class:`mlx_w8a8.Linear`, in place.

    Like ``nn.quantize``: every ``nn.Linear`` whose K is divisible by ``group_size`` and
    every 8-bit affine ``nn.QuantizedLinear`` is converted unless ``class_predicate``
    says otherwise. Embeddings, norms and other layers are left as they are.

    Args:
        model: the model (updated in place and returned).
        class_predicate: ``(path, module) -> bool``; converts the layers it accepts
            (each must still be a convertible layer). Default: all convertible ones.
        group_size: 32, 64 or 128 for layers quantized from float.
        per_channel: symmetric per-channel int8 (default) or group-wise affine for
            layers quantized from float; 8-bit layers keep their own weights.

    Returns:
        The model.
    """
    if group_size not in GROUP_SIZES:
        raise ValueError(
            f"[mlx_w8a8.quantize] group_size must be one of {GROUP_SIZES}, got {group_size!r}"
        )

    def convert(path, layer):
        if not _convertible(layer, group_size):
            return layer
        if class_predicate is not None and not class_predicate(path, layer):
            return layer
        return Linear.from_linear(layer, group_size=group_size, per_channel=per_channel)

    leaves = tree_map_with_path(convert, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)
    return model


def w8a8_layers(model: nn.Module) -> dict[str, dict]:
    """``{path: {"group_size": g, "format": "per_channel" | "grouped"}}`` of the
    model's :class:`Linear` layers."""
    return {
        path: {"group_size": m.group_size, "format": m.quantized_weight.format}
        for path, m in model.named_modules()
        if isinstance(m, Linear)
    }


def save(model: nn.Module, path: str | Path, config: dict | None = None) -> Path:
    """Write ``model`` to the folder ``path`` (created if needed).

    Args:
        model: a model whose linear layers were converted by :func:`quantize`.
        path: the output folder; ``model.safetensors`` and ``config.json`` go there.
        config: the model's configuration (for mlx-lm models: the ``config.json``
            contents, with ``model_type``); the quantization entries are added.

    Returns:
        The folder.
    """
    layers = w8a8_layers(model)
    if not layers:
        raise ValueError(
            "[mlx_w8a8.save] the model has no mlx_w8a8.Linear layers; convert it with "
            "mlx_w8a8.quantize(model) first"
        )
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    cfg = dict(config or {})
    sizes = sorted({entry["group_size"] for entry in layers.values()})
    quantization = dict(cfg.get("quantization") or {})
    # mlx-lm infers each layer's group size from its scales' shape; the top-level
    # value only has to be a valid one.
    quantization.update({"group_size": sizes[0], "bits": 8, "mode": "affine"})
    cfg["quantization"] = quantization
    from . import __version__

    cfg[CONFIG_KEY] = {"version": __version__, "layers": layers}
    (out / CONFIG_FILE).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


def _read_config(folder: Path) -> dict:
    try:
        return json.loads((folder / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise ValueError(f"[mlx_w8a8.load] no {CONFIG_FILE} in {folder}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"[mlx_w8a8.load] {folder / CONFIG_FILE} is not valid JSON: {error}") from None


def load(path: str | Path, model: nn.Module | None = None, strict: bool = True):
    """Load a checkpoint written by :func:`save`, or any mlx-lm 8-bit checkpoint.

    Args:
        path: the checkpoint folder.
        model: an instance of the architecture with float layers. If ``None``, the
            model is built with ``mlx_lm.utils.load_model`` (needs mlx-lm) and its 8-bit
            layers are converted.
        strict: passed to ``load_weights`` (every parameter must match).

    Returns:
        ``(model, config)`` with the W8A8 layers as :class:`mlx_w8a8.Linear`.
    """
    folder = Path(path)
    config = _read_config(folder)
    listed = (config.get(CONFIG_KEY) or {}).get("layers")
    if model is None:
        try:
            from mlx_lm.utils import load_model
        except ImportError:
            raise ValueError(
                "[mlx_w8a8.load] model=None needs mlx-lm to build the architecture "
                "(pip install 'mlx-w8a8[lm]'), or pass an instance as model="
            ) from None
        model, config = load_model(folder, strict=strict)
        if listed is not None:
            predicate = lambda p, m: p in listed  # noqa: E731
        else:  # a stock mlx-lm checkpoint: its 8-bit layers, never its float ones
            predicate = lambda p, m: isinstance(m, nn.QuantizedLinear)  # noqa: E731
        return quantize(model, class_predicate=predicate), config
    if listed is None:
        raise ValueError(
            f"[mlx_w8a8.load] {folder / CONFIG_FILE} has no {CONFIG_KEY!r} entry; with "
            f"model= given the checkpoint must have been written by mlx_w8a8.save"
        )
    for group_size in sorted({entry["group_size"] for entry in listed.values()}):
        quantize(
            model,
            class_predicate=lambda p, m, g=group_size: listed.get(p, {}).get("group_size") == g,
            group_size=group_size,
        )
    missing = sorted(set(listed) - set(w8a8_layers(model)))
    if missing:
        raise ValueError(
            f"[mlx_w8a8.load] the checkpoint's W8A8 layers {missing} are not linear "
            f"layers of the given model"
        )
    model.load_weights(str(folder / WEIGHTS_FILE), strict=strict)
    mx.eval(model.parameters())
    return model, config
