"""Whole models: ``quantize`` in place, ``save`` and ``load`` checkpoints, and the
``python -m mlx_w8a8.convert`` command line.

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

Mixed models keep some layers off W8A8 (``quantize(skip=...)``): on W8A16 (an 8-bit
``nn.QuantizedLinear``) or float. Every layer that differs from the top-level entry is
written per layer, in mlx-lm's convention (``quantization[path]`` is the layer's
``{"group_size", "bits", "mode"}``, or ``false`` for a float layer), so mlx-lm and
:func:`load` build the same layers.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Iterable, Mapping

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path

from . import moe, siblings
from .cachedir import umask
from .kernels import registry
from .nn import Linear
from .summary import summary
from .weight import BITS, GROUP_SIZES, GROUPED4

CONFIG_KEY = "mlx_w8a8"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


KEEP = ("w8a16", "float")
# Files of a source folder that save(source=...) does not copy: the weights (rewritten)
# and the configuration (rewritten with the quantization entries).
_NOT_COPIED = ("*.safetensors", "*.safetensors.index.json", "config.json", "*.bin", "*.pt",
               "*.pth", "*.gguf", "*.npz")

# Converters of layer classes this module does not know, by class: ``(convertible,
# convert)`` (see :func:`register_converter`). mlx_w8a8.distributed registers MLX's
# sharded linear classes when it is imported, and the package imports it, so they are
# in place before any quantize call; nothing here imports the modules that register.
_CONVERTERS: dict[type, tuple[Callable, Callable]] = {}


def register_converter(layer_type: type, convertible: Callable[[nn.Module, int], bool],
                       convert: Callable[[nn.Module, int, bool], nn.Module]) -> None:
    """Make :func:`quantize` convert layers of ``layer_type`` (and its subclasses) with
    ``convert``, where ``convertible`` accepts them.

    A registered class is looked up before the built-in ``nn.Linear`` /
    ``nn.QuantizedLinear`` rules, so a subclass of those can be handled its own way. A
    layer that a ``skip`` pattern matches stays as it is. Registering a class again
    replaces its converter.

    Args:
        layer_type: the layer class.
        convertible: ``(layer, group_size) -> bool``: whether ``convert`` can convert
            this layer with this group size (``False``: the layer is left as it is).
        convert: ``(layer, group_size, per_channel) -> nn.Module``: the W8A8 layer.

    Raises:
        ValueError: when ``layer_type`` is not a class or a converter is not callable.
    """
    if not isinstance(layer_type, type):
        raise ValueError(
            f"[mlx_w8a8.register_converter] layer_type must be a class, got {layer_type!r}"
        )
    for name, fn in (("convertible", convertible), ("convert", convert)):
        if not callable(fn):
            raise ValueError(
                f"[mlx_w8a8.register_converter] {name} must be callable, got {fn!r}"
            )
    _CONVERTERS[layer_type] = (convertible, convert)


def _converter(layer: nn.Module) -> tuple[Callable, Callable] | None:
    """The registered ``(convertible, convert)`` of the nearest class of ``layer``."""
    for cls in type(layer).__mro__:
        found = _CONVERTERS.get(cls)
        if found is not None:
            return found
    return None


def matches(path: str, pattern: str) -> bool:
    """Whether a layer path matches a skip pattern.

    A pattern matches the path itself, any path ending in ``"." + pattern`` (so
    ``"lm_head"`` or ``"down_proj"`` name those layers wherever they sit), or, as a
    shell glob, the whole path (``"model.layers.0.*"``).
    """
    return path == pattern or path.endswith("." + pattern) or fnmatch.fnmatchcase(path, pattern)


def _skip_table(skip) -> list[tuple[str, str]]:
    if skip is None:
        return []
    if isinstance(skip, str):
        skip = [skip]
    try:
        items = list(skip.items()) if isinstance(skip, Mapping) else [(p, "w8a16") for p in skip]
    except TypeError:  # not iterable
        raise ValueError(
            f"[mlx_w8a8.quantize] skip must be a layer pattern, an iterable of them or a "
            f"mapping of them to one of {KEEP}, got {skip!r} ({type(skip).__name__})"
        ) from None
    for pattern, keep in items:
        if not isinstance(pattern, str) or keep not in KEEP:
            raise ValueError(
                f"[mlx_w8a8.quantize] skip maps layer patterns to one of {KEEP}, got "
                f"{pattern!r}: {keep!r}"
            )
    return items


def _convertible(layer: nn.Module, group_size: int) -> bool:
    registered = _converter(layer)
    if registered is not None:
        return registered[0](layer, group_size)
    if isinstance(layer, nn.QuantizedLinear):
        return converts_quantized(layer)
    if isinstance(layer, nn.Linear):
        return layer.weight.shape[-1] % group_size == 0
    return False


def converts_quantized(layer: nn.Module) -> bool:
    """Whether the ``nn.QuantizedLinear`` ``layer`` converts to :class:`Linear` as
    stored: MLX's affine layout with 8-bit or 4-bit codes and a group size of
    ``GROUP_SIZES``."""
    return (layer.bits in BITS and getattr(layer, "mode", "affine") == "affine"
            and layer.group_size in GROUP_SIZES)


def kept_by_model(model: nn.Module) -> set[str]:
    """Paths of the linear layers :func:`quantize` leaves as they are by default, for
    what the model says of them: those its ``quant_predicate`` (mlx-lm's hook on a model
    class, ``(path, module) -> bool | dict``, as ``mlx_lm.utils.quantize_model`` calls it)
    returns ``False`` for, and, where the model holds mixture-of-experts layers, its
    routers (:func:`mlx_w8a8.moe.router_layers`) and the layers its ``quant_predicate``
    returns their own settings for (the routers of the MoE classes that define one)."""
    predicate = getattr(model, "quant_predicate", None)
    has_experts = bool(moe.expert_layers(model))
    kept = set(moe.router_layers(model)) if has_experts else set()
    if callable(predicate):
        for path, m in model.named_modules():
            if not isinstance(m, (nn.Linear, nn.QuantizedLinear)):
                continue
            verdict = predicate(path, m)
            if verdict is False or (has_experts and isinstance(verdict, dict)):
                kept.add(path)
    return kept


def _experts_note(model: nn.Module) -> str:
    """What :func:`quantize` says of a mixture-of-experts model, or ``""``."""
    modules = dict(model.named_modules())
    experts = [m for m in modules.values() if moe.is_expert(m)]
    if not experts:
        return ""
    per_layer = "/".join(map(str, sorted({m.weight.shape[0] for m in experts})))
    classes = ", ".join(sorted({type(m).__name__ for m in experts}))
    routers = [p for p in moe.router_layers(model) if not isinstance(modules[p], Linear)]
    return (f"{len(experts)} mixture-of-experts expert layers ({classes}, {per_layer} "
            f"experts each) were left as they are: this version converts dense linear "
            f"layers only (converting experts is later work); {len(routers)} router layers "
            f"were left as they are too (their outputs choose the experts)")


def quantize(
    model: nn.Module,
    class_predicate: Callable[[str, nn.Module], bool] | None = None,
    group_size: int = 64,
    per_channel: bool = True,
    skip: Mapping[str, str] | Iterable[str] | None = None,
    kernel: str | None = None,
    verbose: bool = False,
) -> nn.Module:
    """Replace linear layers of ``model`` by :class:`mlx_w8a8.Linear`, in place.

    Like ``nn.quantize``: every ``nn.Linear`` whose K is divisible by ``group_size`` and
    every 8-bit or 4-bit affine ``nn.QuantizedLinear`` (the 4-bit ones keep their arrays
    as they are: W4A8, format ``"grouped4"``) is converted unless ``class_predicate``
    says otherwise (without one, the layers the model's own ``quant_predicate`` leaves
    unquantized, and in a mixture-of-experts model the routers and the layers its
    ``quant_predicate`` gives their own settings, stay as they are: see
    :func:`kept_by_model`); so are MLX's sharded linear layers (``model.shard(group)`` first),
    to the W8A8 sharded layers of :mod:`mlx_w8a8.distributed` (left as they are where
    a ``skip`` pattern matches). Embeddings, norms and other layers are left as they
    are. Layers matching a ``skip`` pattern (see :func:`matches`) stay off W8A8:
    ``"w8a16"`` makes a float layer an 8-bit ``nn.QuantizedLinear`` (mlx-lm's group-wise affine, with
    ``group_size``) and keeps an 8-bit one as it is; ``"float"`` leaves it unchanged.

    Args:
        model: the model (updated in place and returned).
        class_predicate: ``(path, module) -> bool``; converts the layers it accepts
            (each must still be a convertible layer). Default: all convertible ones.
        group_size: 32, 64 or 128 for layers quantized from float.
        per_channel: symmetric per-channel int8 (default) or group-wise affine for
            layers quantized from float; 8-bit layers keep their own weights.
        skip: layer patterns to keep off W8A8: ``{pattern: "w8a16" | "float"}`` (the
            first matching pattern decides), or an iterable of patterns kept on W8A16.
            E.g. ``{"lm_head": "float"}`` or ``["lm_head", "down_proj"]``.
        kernel: force this ``linear`` candidate (e.g. ``"exact"``, ``"mlx_qmm"``) in
            every converted layer (``layer.kernel``); ``None`` lets the tuner decide.
        verbose: print :func:`mlx_w8a8.summary` (which kernel each layer runs at
            decode and prefill, and where each decision came from) to stderr, and the
            float layers left float because group_size does not divide their K.
            A model with mixture-of-experts layers (mlx-lm's ``SwitchLinear``) also
            gets a ``UserWarning``: its experts are not converted by this version.

    Returns:
        The model, its sibling layers (q/k/v, gate/up) linked
        (:func:`mlx_w8a8.siblings.link`) so each group can run as one launch.

    Raises:
        ValueError: for a bad ``group_size``, ``skip`` or an unknown ``kernel``.
    """
    if group_size not in GROUP_SIZES:
        raise ValueError(
            f"[mlx_w8a8.quantize] group_size must be one of {GROUP_SIZES}, got {group_size!r}"
        )
    if kernel is not None:
        registry.get("linear", kernel)  # unknown: ValueError naming the known kernels

    table = _skip_table(skip)
    left_as_is = kept_by_model(model) if class_predicate is None else set()

    def convert(path, layer):
        if not _convertible(layer, group_size):
            return layer
        if class_predicate is not None and not class_predicate(path, layer):
            return layer
        if path in left_as_is:
            return layer
        keep = next((k for pattern, k in table if matches(path, pattern)), None)
        registered = _converter(layer)  # MLX's sharded layers: registered by distributed
        if registered is not None:  # a layer a skip pattern matches stays as it is
            return layer if keep else registered[1](layer, group_size, per_channel)
        if keep == "float" or (keep == "w8a16" and isinstance(layer, nn.QuantizedLinear)):
            return layer
        if keep == "w8a16":
            return nn.QuantizedLinear.from_linear(layer, group_size=group_size, bits=8)
        out = Linear.from_linear(layer, group_size=group_size, per_channel=per_channel)
        out.kernel = kernel
        return out

    leaves = tree_map_with_path(convert, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)
    left = sorted(
        {f"{m.bits}-bit {getattr(m, 'mode', 'affine')}" for _, m in model.named_modules()
         if isinstance(m, nn.QuantizedLinear) and not converts_quantized(m)}
    )
    if left:
        warnings.warn(
            f"[mlx_w8a8.quantize] the model holds {', '.join(left)} QuantizedLinear layers; "
            f"only float and 8-bit or 4-bit affine layers (group size one of {GROUP_SIZES}) "
            f"convert, those were left as they are",
            stacklevel=2,
        )
    experts = _experts_note(model)
    if experts:
        warnings.warn(f"[mlx_w8a8.quantize] {experts}", stacklevel=2)
    siblings.link(model)  # q/k/v, gate/up: one launch where a kernel allows
    if verbose:
        print(summary(model), file=sys.stderr)
        # Float layers that stayed float for their K (not convertible, so never touched).
        uneven = [path for path, m in model.named_modules()
                  if type(m) is nn.Linear and m.weight.shape[-1] % group_size]
        if uneven:
            print(f"mlx_w8a8: {len(uneven)} nn.Linear layers kept float, their K not a multiple "
                  f"of group_size {group_size}: {', '.join(sorted(uneven))}", file=sys.stderr)
    return model


def w8a8_layers(model: nn.Module) -> dict[str, dict]:
    """``{path: {"group_size": g, "format": "per_channel" | "grouped"}}`` of the
    model's :class:`Linear` layers; a 4-bit layer's entry is ``{"group_size": g,
    "format": "grouped4", "bits": 4}``."""
    out = {}
    for path, m in model.named_modules():
        if isinstance(m, Linear):
            out[path] = {"group_size": m.group_size, "format": m.quantized_weight.format}
            if m.bits != 8:
                out[path]["bits"] = m.bits
    return out


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
         per_channel: bool = False):
    """Load a checkpoint written by :func:`save`, or any mlx-lm 8-bit checkpoint.

    Args:
        path: the checkpoint folder.
        model: an instance of the architecture with float layers. If ``None``, the
            model is built with ``mlx_lm.utils.load_model`` (needs mlx-lm) and its 8-bit
            layers are converted.
        strict: passed to ``load_weights`` (every parameter must match).
        per_channel: requantize group-wise 8-bit layers (an mlx-lm 8-bit checkpoint's)
            to symmetric per-channel int8, the format of the fastest W8A8 kernels, at a
            small accuracy cost: :func:`mlx_w8a8.requantize.per_channel`, whose report
            (weight SQNR per layer) is logged at INFO on the ``mlx_w8a8`` logger; call
            it yourself with tokens for the logits' SQNR too. Default: ``False``.

    Returns:
        ``(model, config)`` with the W8A8 layers as :class:`mlx_w8a8.Linear`.
    """
    model, config = _load(path, model, strict)
    if per_channel:
        from . import requantize

        logging.getLogger("mlx_w8a8").info("[mlx_w8a8.load] %s",
                                           requantize.per_channel(model).describe())
    return model, config


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
    return model, config


# --- command line: python -m mlx_w8a8.convert -------------------------------------------


def _parser():
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m mlx_w8a8.convert",
        description="Convert a float mlx-lm model folder to a W8A8 checkpoint (stock mlx-lm "
        "loads it as 8-bit), optionally SmoothQuant-smoothed and mixed W8A8/W8A16.",
    )
    p.add_argument("--model", required=True,
                   help="float, 8-bit or 4-bit mlx-lm model folder (4-bit layers are kept "
                   "as stored and run W4A8)")
    p.add_argument("--out", required=True,
                   help="output folder: new or empty; never the model folder, a folder "
                   "inside it or one holding it")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty --out (its checkpoint is replaced, other "
                   "files kept); still never the model folder, inside it or around it")
    p.add_argument("--smooth", type=float, metavar="ALPHA",
                   help="SmoothQuant migration strength in [0, 1] (needs --calibration)")
    p.add_argument("--calibration", metavar="FILE",
                   help="local text file for calibration (tokenized with the model's "
                   "tokenizer when the folder has one, else as bytes), or 'builtin' for "
                   "text of the Python installation; without --smooth and --sqnr-floor "
                   "the recommended recipe (mlx_w8a8.recipe) is applied")
    p.add_argument("--skip", nargs="*", metavar="PATTERN", default=None,
                   help="layers kept off W8A8 (path, suffix such as lm_head or down_proj, "
                   "or glob); default: lm_head; give --skip alone to skip nothing")
    p.add_argument("--sqnr-floor", type=float, metavar="DB",
                   help="also keep off W8A8 every layer whose W8A8 SQNR on the calibration "
                   "data is below DB (needs --calibration)")
    p.add_argument("--keep", choices=KEEP, default="w8a16",
                   help="what skipped layers become (default: w8a16)")
    p.add_argument("--group-size", type=int, default=64, choices=GROUP_SIZES,
                   help="weights per scale of layers quantized from float, and of the "
                   "W8A16 layers (default: 64)")
    p.add_argument("--per-channel", action="store_true",
                   help="requantize the group-wise 8-bit layers of an mlx-lm 8-bit --model to "
                   "per-channel int8 (the fastest W8A8 kernels) and print what it cost "
                   "(weight SQNR; logits SQNR on the calibration text when given)")
    p.add_argument("--grouped", action="store_true",
                   help="group-wise affine weights instead of symmetric per-channel int8")
    p.add_argument("--seq-len", type=int, default=256,
                   help="calibration sequence length in tokens, >= 2 (default: 256)")
    p.add_argument("--samples", type=int, default=4,
                   help="calibration sequences, >= 1 (default: 4, what docs/accuracy.md's "
                   "results used; more sequences cost one forward pass each)")
    p.add_argument("--batch-size", type=int, default=4,
                   help="calibration sequences per forward pass, >= 1 (default: 4)")
    return p


def check_convert_arguments(
    model_path: str | Path,
    out: str | Path,
    smooth_alpha: float | None = None,
    calibration: str | Path | None = None,
    sqnr_floor: float | None = None,
    keep: str = "w8a16",
    group_size: int = 64,
    seq_len: int = 256,
    samples: int = 4,
    batch_size: int = 4,
    force: bool = False,
) -> None:
    """Check :func:`convert`'s arguments without loading anything (the arguments mean
    what they mean there).

    Raises:
        ValueError: naming the argument, the value and what is valid: the model folder
            has no ``config.json`` or is a 4-bit checkpoint (see
            :func:`check_source_quantization`), the calibration file is missing where
            ``smooth_alpha`` or ``sqnr_floor`` needs it, a value is out of range, or
            the output folder is refused (:func:`check_convert_output`).
    """
    op = "mlx_w8a8.convert"
    if (smooth_alpha is not None or sqnr_floor is not None) and calibration is None:
        raise ValueError(f"[{op}] --smooth and --sqnr-floor need --calibration FILE")
    if smooth_alpha is not None and not 0.0 <= smooth_alpha <= 1.0:
        raise ValueError(f"[{op}] --smooth ALPHA must be in [0, 1], got {smooth_alpha!r}")
    if sqnr_floor is not None and not math.isfinite(sqnr_floor):
        raise ValueError(f"[{op}] --sqnr-floor must be a finite number of dB, got {sqnr_floor!r}")
    if keep not in KEEP:
        raise ValueError(f"[{op}] keep must be one of {KEEP}, got {keep!r}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"[{op}] --group-size must be one of {GROUP_SIZES}, got {group_size!r}")
    for flag, value, low in (("--seq-len", seq_len, 2), ("--samples", samples, 1),
                             ("--batch-size", batch_size, 1)):
        if value < low:
            raise ValueError(f"[{op}] {flag} must be >= {low}, got {value}")
    model_path = Path(model_path)
    if not (model_path / CONFIG_FILE).is_file():
        raise ValueError(
            f"[{op}] model must be an mlx-lm model folder (a config.json and weights), got "
            f"{str(model_path)!r}: it has no config.json"
        )
    from .recipe import BUILTIN

    if calibration is not None and str(calibration) != BUILTIN and not Path(calibration).is_file():
        raise ValueError(f"[{op}] calibration must be a text file or {BUILTIN!r}, got "
                         f"{str(calibration)!r}: no such file")
    check_source_quantization(model_path)
    check_convert_output(model_path, Path(out), force)


def check_source_quantization(model_path: Path) -> None:
    """Refuse a checkpoint whose linear layers are all quantized in a layout this
    version does not convert (a bit width other than 8 and 4, or a mode other than
    ``affine``): nothing would be converted. 8-bit and 4-bit affine checkpoints
    convert (the 4-bit layers as stored, W4A8).

    Raises:
        ValueError: saying which layers would stay and how to get a W8A8 model.
    """
    try:
        quant = json.loads((model_path / CONFIG_FILE).read_text()).get("quantization")
    except (OSError, json.JSONDecodeError, AttributeError):
        return  # load_model reports an unreadable configuration

    def converts(entry: dict) -> bool:
        return entry.get("bits") in BITS and entry.get("mode", "affine") == "affine"

    if not isinstance(quant, dict) or quant.get("bits") is None or converts(quant):
        return
    if any(isinstance(v, dict) and converts(v) for v in quant.values()):
        return  # some layers convert, quantize warns about the others
    bits, mode = quant.get("bits"), quant.get("mode", "affine")
    raise ValueError(
        f"[mlx_w8a8.convert] {model_path} is a {bits}-bit {mode} checkpoint: this version "
        f"converts {' and '.join(f'{b}-bit' for b in sorted(BITS, reverse=True))} affine "
        f"layers only, so every quantized linear layer would stay {bits}-bit {mode} and "
        f"nothing would be converted; convert the float form of the model (e.g. the "
        f"original Hugging Face folder, or mlx_lm.convert without -q), or an 8-bit or "
        f"4-bit affine one"
    )


def check_convert_output(model_path: Path, out: Path, force: bool = False) -> None:
    """Refuse an output folder that would destroy or mix up data: the model folder
    itself, a folder inside it or one holding it (never allowed), a file, or a
    non-empty folder unless ``force`` (then its checkpoint is replaced by :func:`save`
    and its other files kept).

    Raises:
        ValueError: naming the folder and why.
    """
    op = "mlx_w8a8.convert"
    src, dst = model_path.resolve(), out.resolve()
    if dst == src:
        raise ValueError(f"[{op}] --out must not be the model folder {str(model_path)!r}: "
                         f"that would overwrite the source checkpoint")
    if src in dst.parents:
        raise ValueError(f"[{op}] --out {str(out)!r} is inside the model folder "
                         f"{str(model_path)!r}; choose a folder outside it")
    if dst in src.parents:
        raise ValueError(f"[{op}] --out {str(out)!r} holds the model folder "
                         f"{str(model_path)!r}; choose a folder outside it")
    if out.exists() and not out.is_dir():
        raise ValueError(f"[{op}] --out must be a folder, got {str(out)!r}: it is a file")
    check_output_folder(op, out)
    if out.is_dir() and not force:
        held = sorted(p.name for p in out.iterdir())
        if held:
            shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
            raise ValueError(f"[{op}] --out {str(out)!r} is not empty ({shown}); choose a new "
                             f"or empty folder, or pass --force to replace the checkpoint "
                             f"in it")


def convert(
    model_path: str | Path,
    out: str | Path,
    smooth_alpha: float | None = None,
    calibration: str | Path | None = None,
    skip: Iterable[str] = ("lm_head",),
    sqnr_floor: float | None = None,
    keep: str = "w8a16",
    group_size: int = 64,
    per_channel: bool = True,
    seq_len: int = 256,
    samples: int = 4,
    batch_size: int = 4,
    log: Callable[[str], None] = print,
    force: bool = False,
    requantize_per_channel: bool = False,
) -> Path:
    """Float mlx-lm folder -> (smoothed, mixed) W8A8 checkpoint folder.

    Args:
        model_path: float mlx-lm model folder.
        out: output folder (weights, ``config.json``, the source's tokenizer and other
            non-weight files, and ``sensitivity.json`` when a report was made).
        smooth_alpha: SmoothQuant strength, or ``None`` for no smoothing.
        calibration: text file (or ``"builtin"``); needed by ``smooth_alpha`` and
            ``sqnr_floor``. Given without either, the recipe of :mod:`mlx_w8a8.recipe`
            (strength per site, W8A16 below its floor) is applied and ``recipe.json``
            written.
        skip: layer patterns kept on ``keep`` (see :func:`matches`).
        sqnr_floor: keep layers whose W8A8 SQNR is below this (dB) on ``keep`` too.
        keep: ``"w8a16"`` or ``"float"``.
        group_size, per_channel: the W8A8 weight format (see :func:`quantize`).
        seq_len, samples, batch_size: calibration windows.
        log: where progress lines go.
        force: write into a non-empty ``out`` (see :func:`check_convert_arguments`).
        requantize_per_channel: requantize group-wise 8-bit layers (an 8-bit
            ``model_path``) to per-channel int8 and log the cost
            (:func:`mlx_w8a8.requantize.per_channel`).

    Returns:
        The output folder.

    Raises:
        ValueError: for any argument :func:`check_convert_arguments` refuses (before
            the model is loaded), or when no layer could be converted.
    """
    from mlx_lm.utils import load_model

    from .calibrate import calibrate
    from .recipe import calibration_tokens, recipe
    from .sensitivity import policy, sensitivity
    from .smooth import smooth
    from .tokens import batches

    check_convert_arguments(model_path, out, smooth_alpha, calibration, sqnr_floor, keep,
                            group_size, seq_len, samples, batch_size, force)
    model_path, out = Path(model_path), Path(out)
    model, config = load_model(model_path)
    data = None
    if calibration is not None:
        tokens = calibration_tokens(calibration, model_path)
        data = batches(tokens, seq_len, batch_size, limit=samples)
        log(f"calibration: {sum(b.shape[0] for b in data)} x {seq_len} tokens from {calibration}")
    if smooth_alpha is not None:
        stats = calibrate(model, data, progress=True)
        applied = smooth(model, stats, smooth_alpha)
        log(f"smoothed {len(applied)} sites with alpha = {smooth_alpha}")
    table = {pattern: keep for pattern in skip}
    report = chosen = None
    # The recipe smooths and scores float layers; a quantized checkpoint (8-bit layers
    # converted as stored) has none to smooth, so its calibration text only feeds the
    # requantization report.
    floats = any(isinstance(m, nn.Linear) and not isinstance(m, nn.QuantizedLinear)
                 for _, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module))
    if calibration is not None and smooth_alpha is None and sqnr_floor is None and floats:
        chosen = recipe(model, data, keep=keep, group_size=group_size, progress=True)
        log(chosen.summary())
        table.update(chosen.keep)
    if sqnr_floor is not None:
        report = sensitivity(model, data, group_size, per_channel, progress=True)
        log(report.table())
        below = policy(report, sqnr_floor, keep)
        log(f"{len(below)} layers below {sqnr_floor} dB kept on {keep}: {sorted(below)}")
        table.update(below)
    quantize(model, group_size=group_size, per_channel=per_channel, skip=table)
    if requantize_per_channel:
        from . import requantize

        sample = data[0][:1] if data else None
        log(requantize.per_channel(model, tokens=sample).describe())
    kinds = {"w8a8": 0, "w8a16": 0, "float": 0}
    for _, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module):
        if isinstance(m, Linear):
            kinds["w8a8"] += 1
        elif isinstance(m, nn.QuantizedLinear):
            kinds["w8a16"] += 1
        elif isinstance(m, nn.Linear):
            kinds["float"] += 1
    save(model, out, config, source=model_path)
    if report is not None:  # after the checkpoint, which save swaps in as a new folder
        report.save(out / "sensitivity.json")
    if chosen is not None:
        chosen.save(out / "recipe.json")
    log(f"wrote {out}: linear layers {kinds}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    skip = ["lm_head"] if args.skip is None else args.skip
    try:  # every argument, before minutes of loading and calibrating
        check_convert_arguments(args.model, args.out, args.smooth, args.calibration,
                                args.sqnr_floor, args.keep, args.group_size, args.seq_len,
                                args.samples, args.batch_size, args.force)
    except ValueError as error:
        parser.error(str(error))  # exit status 2
    if args.per_channel and args.grouped:
        parser.error("--per-channel (requantize 8-bit layers per channel) and --grouped "
                     "(group-wise weights) contradict each other; give one")
    try:
        convert(
            args.model, args.out, args.smooth, args.calibration, skip,
            args.sqnr_floor, args.keep, args.group_size, not args.grouped,
            args.seq_len, args.samples, args.batch_size, force=args.force,
            requantize_per_channel=args.per_channel,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
