"""Checkpoints of converted models: :func:`save` (written whole or not at all) and
:func:`load`.

A checkpoint is a folder holding ``model.safetensors`` and ``config.json``. W8A8 layers
are stored in MLX's affine 8-bit layout under the parameter names of
``nn.QuantizedLinear``, and ``config.json`` carries the standard ``"quantization"``
entry, so stock mlx-lm loads the folder as an ordinary 8-bit model. The ``"mlx_w8a8"``
entry lists the W8A8 layers so :func:`load` brings them back as :class:`Linear`.

MLX's 4-bit affine layers (mlx-lm's default, format ``"grouped4"``) convert as they
are stored: the :class:`Linear` holds the same arrays, and :func:`save` writes them in
mlx-lm's own 4-bit format (a per-layer ``{"bits": 4}`` entry, or the top-level entry
when every converted layer is 4-bit), so stock mlx-lm loads the folder as the same
4-bit model.

Mixed models keep some layers off W8A8 (:func:`mlx_w8a8.quantize` ``skip=...``): on
W8A16 (an 8-bit ``nn.QuantizedLinear``) or float. Every layer that differs from the
top-level entry is written per layer, in mlx-lm's convention (``quantization[path]`` is
the layer's ``{"group_size", "bits", "mode"}``, or ``false`` for a float layer), so
mlx-lm and :func:`load` build the same layers.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .cachedir import umask
from .nn import Linear
from .quantizer import converts_quantized, kept_by_model, quantize, set_act_scales, w8a8_layers
from .kernels.registry import ACT_SCALES
from .weight import GROUPED4

CONFIG_KEY = "mlx_w8a8"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"

# Files of a source folder that save(source=...) does not copy: the weights (rewritten)
# and the configuration (rewritten with the quantization entries).
_NOT_COPIED = ("*.safetensors", "*.safetensors.index.json", "config.json", "*.bin", "*.pt",
               "*.pth", "*.gguf", "*.npz")


def _layer_entries(model: nn.Module, default: dict) -> dict:
    """mlx-lm's per-layer ``quantization[path]`` entries: every 8-bit layer whose
    parameters differ from ``default`` and every W8A16 layer (a dict), every float
    linear layer (``False``)."""
    entries = {}
    for path, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module):
        if isinstance(m, (Linear, nn.QuantizedLinear)):
            params = {"group_size": m.group_size, "bits": m.bits, "mode": getattr(m, "mode", "affine")}
            if isinstance(m, nn.QuantizedLinear) or params != default:
                entries[path] = params
        elif isinstance(m, nn.Linear):
            entries[path] = False
    return entries


def copy_non_weight_files(source: str | Path, out: str | Path) -> list[str]:
    """Copy the tokenizer and the other non-weight files of a model folder, as
    ``mlx_lm.convert`` does (weights and ``config.json`` are not copied).

    Args:
        source: the source model folder.
        out: the output folder.

    Returns:
        The names copied.
    """
    src, dst = Path(source), Path(out)
    if not src.is_dir():
        raise ValueError(f"[mlx_w8a8.save] source folder {src} does not exist")
    copied = []
    for f in sorted(src.iterdir()):
        if not f.is_file() or any(fnmatch.fnmatch(f.name, pat) for pat in _NOT_COPIED):
            continue
        if f.resolve() != (dst / f.name).resolve():
            shutil.copy2(f, dst / f.name)
        copied.append(f.name)
    return copied


def check_output_folder(op: str, out: Path) -> None:
    """Refuse an output folder holding weight files other than :data:`WEIGHTS_FILE`:
    mlx-lm loads every ``model*.safetensors`` of a folder, so they would be loaded
    beside the new weights (and fail, or mix two models).

    Raises:
        ValueError: naming ``op``, the folder and the files.
    """
    stale = sorted(p.name for p in out.glob("*.safetensors") if p.name != WEIGHTS_FILE)
    if stale:
        raise ValueError(
            f"[{op}] {out} already holds weight files {stale}, which mlx-lm would load "
            f"beside the new {WEIGHTS_FILE}; write to an empty folder or remove them"
        )


def save(
    model: nn.Module,
    path: str | Path,
    config: dict | None = None,
    source: str | Path | None = None,
) -> Path:
    """Write ``model`` to the folder ``path`` (created if needed), whole or not at all.

    The checkpoint is written into a temporary folder beside ``path`` and swapped in
    when complete: an existing checkpoint there stays as it was until then, and is
    left intact when writing fails (the temporary folder is removed; a process killed
    mid-write leaves it behind, named ``.<name>.w8a8-tmp-*``). Files of an existing
    folder other than a checkpoint's weights, configuration and shard index (a
    tokenizer, notes) are kept unless ``source`` provides a file of the same name.

    Args:
        model: a model whose linear layers were converted by :func:`quantize`.
        path: the output folder; ``model.safetensors`` and ``config.json`` go there.
        config: the model's configuration (for mlx-lm models: the ``config.json``
            contents, with ``model_type``); the quantization entries are added.
        source: the folder the model was loaded from; its tokenizer and other
            non-weight files are copied (so ``mlx_lm.load`` of the output works).
            A ``UserWarning`` says so when the folder ends up with no tokenizer for an
            mlx-lm model (a ``config`` with ``model_type``).

    Returns:
        The folder.

    Raises:
        ValueError: when the model has no W8A8 layers, ``path`` is a file, or the folder
            already holds other ``*.safetensors`` files (mlx-lm would load them too;
            nothing is written).
        OSError: when writing fails; an existing checkpoint at ``path`` is left as it was.
    """
    layers = w8a8_layers(model)
    if not layers:
        raise ValueError(
            f"[mlx_w8a8.save] the model has no mlx_w8a8.Linear layers; {_no_w8a8_advice(model)}"
        )
    out = Path(path)
    # The folder the swap replaces: absolute (a relative "." has no name to put beside),
    # and where out is a link, the folder it names (the link itself stays).
    target = out.resolve() if out.is_symlink() else Path(os.path.abspath(out))
    check_output_folder("mlx_w8a8.save", target)
    if target.exists() and not target.is_dir():
        raise ValueError(f"[mlx_w8a8.save] path must be a folder, got {str(out)!r}: it is a file")
    cfg = _checkpoint_config(model, layers, config)
    weights = dict(tree_flatten(model.parameters()))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.w8a8-tmp-", dir=target.parent))
    try:
        os.chmod(tmp, (target.stat().st_mode & 0o7777) if target.is_dir() else 0o777 & ~umask())
        if source is not None:
            copy_non_weight_files(source, tmp)
        if target.is_dir():
            _carry_over(target, tmp)
        _write_checkpoint(tmp, weights, cfg)
        _swap_in(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if "model_type" in cfg and not any((target / name).is_file() for name in TOKENIZER_FILES):
        warnings.warn(
            f"[mlx_w8a8.save] {out} has no tokenizer, so mlx_lm.load({str(out)!r}) will fail "
            f"to load one; pass source= the folder the model was loaded from (its tokenizer "
            f"and other non-weight files are copied), or copy the tokenizer files "
            f"({', '.join(TOKENIZER_FILES[:2])}, ...) into it",
            UserWarning,
            stacklevel=2,
        )
    return out


# Files by which a folder holds a tokenizer mlx-lm (transformers' AutoTokenizer) can load.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "spiece.model")


def _no_w8a8_advice(model: nn.Module) -> str:
    """How to get W8A8 layers into a model that has none."""
    low = sorted({m.bits for _, m in model.named_modules()
                  if isinstance(m, nn.QuantizedLinear) and not converts_quantized(m)})
    if low:
        return (f"its linear layers are {'/'.join(map(str, low))}-bit, which this version "
                f"does not convert (they would stay as they are); quantize the float, "
                f"8-bit or 4-bit affine form of the model instead")
    return "convert it with mlx_w8a8.quantize(model) first"


def _checkpoint_config(model: nn.Module, layers: dict, config: dict | None) -> dict:
    """``config`` with the quantization entries of ``model`` (mlx-lm's and this package's)."""
    cfg = dict(config or {})
    # Every converted layer 4-bit (a 4-bit model as stored): the top-level entry says
    # 4 bits, as mlx-lm's own 4-bit checkpoints do; else 8 bits, 4-bit layers per layer.
    bits = 4 if all(entry.get("bits") == 4 for entry in layers.values()) else 8
    sizes = sorted({entry["group_size"] for entry in layers.values()
                    if entry.get("bits", 8) == bits})
    default = {"group_size": sizes[0], "bits": bits, "mode": "affine"}
    quantization = {  # per-layer entries of an earlier quantization are rewritten
        k: v for k, v in (cfg.get("quantization") or {}).items() if not isinstance(v, (dict, bool))
    }
    quantization.update(default)
    quantization.update(_layer_entries(model, default))
    cfg["quantization"] = quantization
    cfg["quantization_config"] = quantization  # mlx-lm writes both (Hugging Face's name)
    from ._version import __version__

    cfg[CONFIG_KEY] = {"version": __version__, "layers": layers}
    return cfg


def _write_checkpoint(folder: Path, weights: dict, cfg: dict) -> None:
    """The weights, then the configuration, each flushed to disk."""
    mx.save_safetensors(str(folder / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    with open(folder / CONFIG_FILE, "w", encoding="utf-8") as f:
        f.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    _fsync(folder / WEIGHTS_FILE)


# What a new checkpoint replaces in an existing folder: its weights, its configuration,
# and an index of shards (which would name weights the folder no longer holds).
_REPLACED = (WEIGHTS_FILE, CONFIG_FILE, "*.safetensors.index.json")


def _carry_over(old: Path, new: Path) -> None:
    """Hard-link (else copy) into ``new`` every entry of ``old`` but those a checkpoint
    replaces (:data:`_REPLACED`) and those ``new`` holds already. Nothing is written to
    a carried file afterwards: a hard link shares its data with the old folder's file."""
    for entry in old.iterdir():
        if any(fnmatch.fnmatch(entry.name, pat) for pat in _REPLACED):
            continue
        target = new / entry.name
        if target.exists() or target.is_symlink():
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, target, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, target)


def _link_or_copy(src, dst) -> None:
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _swap_in(tmp: Path, out: Path) -> None:
    """Put the complete folder ``tmp`` at ``out``. An existing ``out`` is renamed aside
    first and removed only after ``tmp`` took its place. Hazard: a process killed
    between the two renames leaves no ``out``; the old checkpoint is then whole in the
    ``.<name>.w8a8-old-*`` folder beside it."""
    _fsync(tmp)
    if not out.exists():
        os.rename(tmp, out)
    else:
        aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.w8a8-old-", dir=out.parent))
        os.rename(out, aside / out.name)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(aside / out.name, out)  # put the old one back
            shutil.rmtree(aside, ignore_errors=True)
            raise
        shutil.rmtree(aside, ignore_errors=True)
    _fsync(out.parent)


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file or a folder) to disk where the platform allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _read_config(folder: Path) -> dict:
    try:
        return json.loads((folder / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise ValueError(f"[mlx_w8a8.load] no {CONFIG_FILE} in {folder}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"[mlx_w8a8.load] {folder / CONFIG_FILE} is not valid JSON: {error}") from None


def load(path: str | Path, model: nn.Module | None = None, strict: bool = True,
         per_channel: bool = False, act_scales: str | None = None):
    """Load a checkpoint written by :func:`save`, or any mlx-lm 8-bit or 4-bit checkpoint.

    Args:
        path: the checkpoint folder.
        model: an instance of the architecture with float layers. If ``None``, the
            model is built with ``mlx_lm.utils.load_model`` (needs mlx-lm) and its 8-bit
            and 4-bit layers are converted.
        strict: passed to ``load_weights`` (every parameter must match).
        per_channel: requantize group-wise layers (an mlx-lm 8-bit or 4-bit
            checkpoint's) to symmetric per-channel int8, the format of the fastest W8A8
            kernels, at a small accuracy cost (and twice the memory of 4-bit weights):
            :func:`mlx_w8a8.requantize.per_channel`, whose report (weight SQNR per layer,
            bytes) is logged at INFO on the ``mlx_w8a8`` logger; call it yourself with
            tokens for the logits' SQNR too. Default: ``False``.
        act_scales: ``"token"`` or ``"group"``: set every W8A8 layer's
            :attr:`mlx_w8a8.Linear.act_scales` (``"group"``: group-wise layers only,
            so not with ``per_channel=True``). Default: as the checkpoint says (per token
            for a stock mlx-lm checkpoint).

    Returns:
        ``(model, config)`` with the W8A8 layers as :class:`mlx_w8a8.Linear`.
    """
    if act_scales is not None and act_scales not in ACT_SCALES:
        raise ValueError(
            f"[mlx_w8a8.load] act_scales must be None or one of {ACT_SCALES}, got {act_scales!r}"
        )
    if per_channel and act_scales == "group":
        raise ValueError(
            "[mlx_w8a8.load] act_scales='group' needs group-wise weights, got "
            "per_channel=True (which requantizes them per channel)"
        )
    model, config = _load(path, model, strict)
    if per_channel:
        from . import requantize

        logging.getLogger("mlx_w8a8").info("[mlx_w8a8.load] %s",
                                           requantize.per_channel(model).describe())
    if act_scales is not None:
        set_act_scales("mlx_w8a8.load", [(p, m) for p, m in model.named_modules()
                                         if isinstance(m, Linear)], act_scales, f" in {path}")
    return model, config


def restore_layer_settings(model: nn.Module, listed: dict, act_scales: bool = True) -> None:
    """Set the outlier channels each layer listed in a checkpoint's ``"mlx_w8a8"`` entry
    was saved with (none where the entry lists none) and, with ``act_scales``, its
    activation scaling (``"token"`` where the entry has none)."""
    for p, m in model.named_modules():
        if isinstance(m, Linear) and p in listed:
            if act_scales:
                m.act_scales = listed[p].get("act_scales", "token")
            m.outliers = listed[p].get("outliers")


def _load(path: str | Path, model: nn.Module | None, strict: bool):
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
        else:  # a stock mlx-lm checkpoint: its 8-bit layers, never its float ones, and
            # not the layers the model keeps as they are (an MoE model's routers)
            kept = kept_by_model(model)
            predicate = lambda p, m: isinstance(m, nn.QuantizedLinear) and p not in kept  # noqa: E731
        quantize(model, class_predicate=predicate)
        if listed is not None:
            restore_layer_settings(model, listed)
        if not w8a8_layers(model):
            warnings.warn(
                f"[mlx_w8a8.load] {folder} holds no 8-bit, 4-bit or W8A8 linear layers, so none "
                f"were converted and the model runs as stored; quantize a float model "
                f"with mlx_w8a8.quantize(model) (or python -m mlx_w8a8.convert)",
                stacklevel=3,
            )
        return model, config
    if listed is None:
        raise ValueError(
            f"[mlx_w8a8.load] {folder / CONFIG_FILE} has no {CONFIG_KEY!r} entry; with "
            f"model= given the checkpoint must have been written by mlx_w8a8.save"
        )
    four = {p: {"group_size": e["group_size"], "bits": 4, "mode": "affine"}
            for p, e in listed.items() if e.get("format") == GROUPED4}
    if four:  # 4-bit layers as stored: nn.QuantizedLinear first, converted below
        nn.quantize(model, class_predicate=lambda p, m: four.get(p, False))
    for group_size in sorted({entry["group_size"] for entry in listed.values()}):
        quantize(
            model,
            class_predicate=lambda p, m, g=group_size: listed.get(p, {}).get("group_size") == g,
            group_size=group_size,
        )
    per_layer = config.get("quantization") or {}
    w8a16 = {p: v for p, v in per_layer.items() if isinstance(v, dict) and p not in listed}
    if w8a16:  # the W8A16 layers of a mixed model, as mlx-lm builds them
        nn.quantize(model, class_predicate=lambda p, m: w8a16.get(p, False))
    missing = sorted(set(listed) - set(w8a8_layers(model)))
    if missing:
        raise ValueError(
            f"[mlx_w8a8.load] the checkpoint's W8A8 layers {missing} are not linear "
            f"layers of the given model"
        )
    model.load_weights(str(folder / WEIGHTS_FILE), strict=strict)
    mx.eval(model.parameters())
    restore_layer_settings(model, listed)
    return model, config
