"""A model folder to a W8A8 checkpoint folder: :func:`convert`, the work of ``python -m
mlx_w8a8.convert``, and the checks of its arguments (:func:`check_convert_arguments`),
made before anything is loaded.

:func:`convert` loads an mlx-lm folder (float, 8-bit or 4-bit), optionally calibrates
and smooths it (SmoothQuant), applies the recipe of :mod:`mlx_w8a8.recipe` or a
sensitivity floor, quantizes it (:func:`mlx_w8a8.quantize`) and saves it
(:func:`mlx_w8a8.save`, with the source's tokenizer), reporting progress through ``log``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Iterable

import mlx.nn as nn
from mlx.utils import tree_flatten

from .checkpoint import CONFIG_FILE, check_output_folder, save
from .nn import Linear
from .quantizer import KEEP, quantize
from .weight import BITS, GROUP_SIZES


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
    act_scales: str = "token",
    outliers: int | None = None,
) -> Path:
    """Float mlx-lm folder -> (smoothed, mixed) W8A8 checkpoint folder.

    Args:
        model_path: float mlx-lm model folder.
        out: output folder (weights, ``config.json``, the source's tokenizer and other
            non-weight files, and ``sensitivity.json`` when a report was made).
        smooth_alpha: SmoothQuant strength, or ``None`` for no smoothing.
        calibration: text file (or ``"builtin"``); needed by ``smooth_alpha`` and
            ``sqnr_floor``. Given without ``smooth_alpha``, the recipe of
            :mod:`mlx_w8a8.recipe` (outlier channels per layer, W8A16 below its floor;
            a quantized checkpoint's layers below it stay as stored) is applied and
            ``recipe.json`` written.
        skip: layer patterns kept on ``keep`` (see :func:`mlx_w8a8.quantizer.matches`).
        sqnr_floor: keep layers whose W8A8 SQNR is below this (dB) on ``keep``: the
            recipe's floor (``None``: :data:`mlx_w8a8.recipe.FLOOR_DB`); with
            ``smooth_alpha``, the floor of the smoothed model's sensitivity report
            (``sensitivity.json``).
        keep: ``"w8a16"`` or ``"float"``.
        group_size, per_channel: the W8A8 weight format (see :func:`mlx_w8a8.quantize`).
        seq_len, samples, batch_size: calibration windows.
        log: where progress lines go.
        force: write into a non-empty ``out`` (see :func:`check_convert_arguments`).
        requantize_per_channel: requantize group-wise layers (an 8-bit or 4-bit
            ``model_path``) to per-channel int8 and log the cost
            (:func:`mlx_w8a8.requantize.per_channel`).
        act_scales: ``"token"`` or ``"group"`` (group-wise weights: ``per_channel``
            False, no ``requantize_per_channel``): the W8A8 layers'
            :attr:`mlx_w8a8.Linear.act_scales`, saved with the checkpoint.
        outliers: the recipe's outlier channels per layer (``None``: its default,
            :data:`mlx_w8a8.recipe.OUTLIERS`; 0: none, and its floor judges the layers
            without them).

    Returns:
        The output folder.

    Raises:
        ValueError: for any argument :func:`check_convert_arguments` refuses (before
            the model is loaded), or when no layer could be converted.
    """
    from mlx_lm.utils import load_model

    from .calibrate import calibrate
    from .recipe import FLOOR_DB, OUTLIERS, calibration_tokens, recipe
    from .sensitivity import policy, sensitivity
    from .smooth import smooth
    from .tokens import batches

    check_convert_arguments(model_path, out, smooth_alpha, calibration, sqnr_floor, keep,
                            group_size, seq_len, samples, batch_size, force)
    if act_scales == "group" and (per_channel or requantize_per_channel):
        raise ValueError("[mlx_w8a8.convert] activation groups need group-wise weights: "
                         "not with per-channel weights or --per-channel")
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
    # The recipe chooses every layer's outlier channels and scores every layer that
    # quantize converts; a quantized checkpoint's layers are scored against their stored
    # weights and the ones below the floor stay as stored.
    if calibration is not None and smooth_alpha is None:
        chosen = recipe(model, data, keep=keep, group_size=group_size, progress=True,
                        outliers=OUTLIERS if outliers is None else outliers,
                        floor_db=FLOOR_DB if sqnr_floor is None else sqnr_floor)
        log(chosen.summary())
        table.update(chosen.keep)
    elif sqnr_floor is not None:
        report = sensitivity(model, data, group_size, per_channel, progress=True)
        log(report.table())
        below = policy(report, sqnr_floor, keep)
        log(f"{len(below)} layers below {sqnr_floor} dB kept on {keep}: {sorted(below)}")
        table.update(below)
    quantize(model, group_size=group_size, per_channel=per_channel, skip=table,
             act_scales=act_scales)
    if chosen is not None:
        chosen.apply(model)  # its outlier channels, on the layers just converted
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
