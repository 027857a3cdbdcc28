"""Whole models: ``quantize`` in place, ``save`` and ``load`` checkpoints, and the
``python -m mlx_w8a8.convert`` command line.

A checkpoint is a folder holding ``model.safetensors`` and ``config.json``. W8A8 layers
are stored in MLX's affine 8-bit layout under the parameter names of
``nn.QuantizedLinear``, and ``config.json`` carries the standard ``"quantization"``
entry, so stock mlx-lm loads the folder as an ordinary 8-bit model. The ``"mlx_w8a8"``
entry lists the W8A8 layers so :func:`load` brings them back as :class:`Linear`.

Mixed models keep some layers off W8A8 (``quantize(skip=...)``): on W8A16 (an 8-bit
``nn.QuantizedLinear``) or float. Every layer that differs from the top-level entry is
written per layer, in mlx-lm's convention (``quantization[path]`` is the layer's
``{"group_size", "bits", "mode"}``, or ``false`` for a float layer), so mlx-lm and
:func:`load` build the same layers.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import sys
import warnings
from pathlib import Path
from typing import Callable, Iterable, Mapping

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path

from . import distributed, siblings
from .kernels import registry
from .nn import Linear
from .summary import summary
from .weight import GROUP_SIZES

CONFIG_KEY = "mlx_w8a8"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


KEEP = ("w8a16", "float")
# Files of a source folder that save(source=...) does not copy: the weights (rewritten)
# and the configuration (rewritten with the quantization entries).
_NOT_COPIED = ("*.safetensors", "*.safetensors.index.json", "config.json", "*.bin", "*.pt",
               "*.pth", "*.gguf", "*.npz")


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
    if distributed.is_mlx_sharded(layer):
        return distributed.convertible(layer, group_size)
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
    skip: Mapping[str, str] | Iterable[str] | None = None,
    kernel: str | None = None,
    verbose: bool = False,
) -> nn.Module:
    """Replace linear layers of ``model`` by :class:`mlx_w8a8.Linear`, in place.

    Like ``nn.quantize``: every ``nn.Linear`` whose K is divisible by ``group_size`` and
    every 8-bit affine ``nn.QuantizedLinear`` is converted unless ``class_predicate``
    says otherwise; so are MLX's sharded linear layers (``model.shard(group)`` first),
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

    def convert(path, layer):
        if not _convertible(layer, group_size):
            return layer
        if class_predicate is not None and not class_predicate(path, layer):
            return layer
        keep = next((k for pattern, k in table if matches(path, pattern)), None)
        if distributed.is_mlx_sharded(layer):  # sharded layers a skip pattern matches stay
            return layer if keep else distributed.from_sharded(layer, group_size, per_channel)
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
         if isinstance(m, nn.QuantizedLinear) and not (m.bits == 8 and getattr(m, "mode", "affine") == "affine")}
    )
    if left:
        warnings.warn(
            f"[mlx_w8a8.quantize] the model holds {', '.join(left)} QuantizedLinear layers; "
            f"only float and 8-bit affine layers convert to W8A8, those were left as they are",
            stacklevel=2,
        )
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
    model's :class:`Linear` layers."""
    return {
        path: {"group_size": m.group_size, "format": m.quantized_weight.format}
        for path, m in model.named_modules()
        if isinstance(m, Linear)
    }


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
    """Write ``model`` to the folder ``path`` (created if needed).

    Args:
        model: a model whose linear layers were converted by :func:`quantize`.
        path: the output folder; ``model.safetensors`` and ``config.json`` go there.
        config: the model's configuration (for mlx-lm models: the ``config.json``
            contents, with ``model_type``); the quantization entries are added.
        source: the folder the model was loaded from; its tokenizer and other
            non-weight files are copied (so ``mlx_lm.load`` of the output works).

    Returns:
        The folder.

    Raises:
        ValueError: when the model has no W8A8 layers, or the folder already holds other
            ``*.safetensors`` files (mlx-lm would load them too; nothing is written).
    """
    layers = w8a8_layers(model)
    if not layers:
        raise ValueError(
            "[mlx_w8a8.save] the model has no mlx_w8a8.Linear layers; convert it with "
            "mlx_w8a8.quantize(model) first"
        )
    out = Path(path)
    check_output_folder("mlx_w8a8.save", out)
    out.mkdir(parents=True, exist_ok=True)
    if source is not None:
        copy_non_weight_files(source, out)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    cfg = dict(config or {})
    sizes = sorted({entry["group_size"] for entry in layers.values()})
    default = {"group_size": sizes[0], "bits": 8, "mode": "affine"}
    quantization = {  # per-layer entries of an earlier quantization are rewritten
        k: v for k, v in (cfg.get("quantization") or {}).items() if not isinstance(v, (dict, bool))
    }
    quantization.update(default)
    quantization.update(_layer_entries(model, default))
    cfg["quantization"] = quantization
    cfg["quantization_config"] = quantization  # mlx-lm writes both (Hugging Face's name)
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
        quantize(model, class_predicate=predicate)
        if not w8a8_layers(model):
            warnings.warn(
                f"[mlx_w8a8.load] {folder} holds no 8-bit or W8A8 linear layers, so none "
                f"were converted and the model runs as stored; quantize a float model "
                f"with mlx_w8a8.quantize(model) (or python -m mlx_w8a8.convert)",
                stacklevel=2,
            )
        return model, config
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
    p.add_argument("--model", required=True, help="float mlx-lm model folder")
    p.add_argument("--out", required=True, help="output folder")
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
    p.add_argument("--group-size", type=int, default=64, choices=(32, 64, 128))
    p.add_argument("--grouped", action="store_true",
                   help="group-wise affine weights instead of symmetric per-channel int8")
    p.add_argument("--seq-len", type=int, default=512, help="calibration sequence length")
    p.add_argument("--samples", type=int, default=64, help="calibration sequences")
    p.add_argument("--batch-size", type=int, default=4)
    return p


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
    seq_len: int = 512,
    samples: int = 64,
    batch_size: int = 4,
    log: Callable[[str], None] = print,
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

    Returns:
        The output folder.
    """
    from mlx_lm.utils import load_model

    from .calibrate import calibrate
    from .recipe import BUILTIN, calibration_tokens, recipe
    from .sensitivity import policy, sensitivity
    from .smooth import smooth
    from .tokens import batches

    op = "mlx_w8a8.convert"
    if (smooth_alpha is not None or sqnr_floor is not None) and calibration is None:
        raise ValueError(f"[{op}] --smooth and --sqnr-floor need --calibration FILE")
    if keep not in KEEP:
        raise ValueError(f"[{op}] keep must be one of {KEEP}, got {keep!r}")
    model_path, out = Path(model_path), Path(out)
    if not (model_path / "config.json").is_file():
        raise ValueError(
            f"[{op}] model must be an mlx-lm model folder (a config.json and weights), got "
            f"{str(model_path)!r}: it has no config.json"
        )
    if calibration is not None and str(calibration) != BUILTIN and not Path(calibration).is_file():
        raise ValueError(f"[{op}] calibration must be a text file, got {str(calibration)!r}: no such file")
    check_output_folder(op, out)  # before minutes of calibration, not after
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
    if calibration is not None and smooth_alpha is None and sqnr_floor is None:
        chosen = recipe(model, data, keep=keep, group_size=group_size, progress=True)
        out.mkdir(parents=True, exist_ok=True)
        chosen.save(out / "recipe.json")
        log(chosen.summary())
        table.update(chosen.keep)
    if sqnr_floor is not None:
        report = sensitivity(model, data, group_size, per_channel, progress=True)
        out.mkdir(parents=True, exist_ok=True)
        report.save(out / "sensitivity.json")
        log(report.table())
        below = policy(report, sqnr_floor, keep)
        log(f"{len(below)} layers below {sqnr_floor} dB kept on {keep}: {sorted(below)}")
        table.update(below)
    quantize(model, group_size=group_size, per_channel=per_channel, skip=table)
    kinds = {"w8a8": 0, "w8a16": 0, "float": 0}
    for _, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module):
        if isinstance(m, Linear):
            kinds["w8a8"] += 1
        elif isinstance(m, nn.QuantizedLinear):
            kinds["w8a16"] += 1
        elif isinstance(m, nn.Linear):
            kinds["float"] += 1
    save(model, out, config, source=model_path)
    log(f"wrote {out}: linear layers {kinds}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        convert(
            args.model, args.out, args.smooth, args.calibration,
            ["lm_head"] if args.skip is None else args.skip,
            args.sqnr_floor, args.keep, args.group_size, not args.grouped,
            args.seq_len, args.samples, args.batch_size,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
