"""``python -m mlx_w8a8.convert``: an mlx-lm model folder to a W8A8 checkpoint (stock
mlx-lm loads it as 8-bit), optionally SmoothQuant-smoothed and mixed W8A8/W8A16.

The command line only: the conversion is :func:`mlx_w8a8.folder_convert.convert`, over
:mod:`mlx_w8a8.quantizer` (``quantize``), :mod:`mlx_w8a8.checkpoint` (``save``,
``load``) and :mod:`mlx_w8a8.converters` (``register_converter``). Their names are
re-exported here for code that imports them from ``mlx_w8a8.convert``; the package
itself never imports this module.
"""

from __future__ import annotations

import argparse
import sys

from .checkpoint import (
    CONFIG_FILE,
    CONFIG_KEY,
    TOKENIZER_FILES,
    WEIGHTS_FILE,
    check_output_folder,
    copy_non_weight_files,
    load,
    save,
)
from .converters import register_converter
from .folder_convert import (
    check_convert_arguments,
    check_convert_output,
    check_source_quantization,
    convert,
)
from .quantizer import KEEP, converts_quantized, kept_by_model, matches, quantize, w8a8_layers
from .weight import GROUP_SIZES

__all__ = [
    "CONFIG_FILE",
    "CONFIG_KEY",
    "KEEP",
    "TOKENIZER_FILES",
    "WEIGHTS_FILE",
    "check_convert_arguments",
    "check_convert_output",
    "check_output_folder",
    "check_source_quantization",
    "convert",
    "converts_quantized",
    "copy_non_weight_files",
    "kept_by_model",
    "load",
    "main",
    "matches",
    "quantize",
    "register_converter",
    "save",
    "w8a8_layers",
]


def _parser() -> argparse.ArgumentParser:
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
                   "text of the Python installation; without --smooth the recommended "
                   "recipe (mlx_w8a8.recipe: outlier channels per layer, W8A16 below a "
                   "floor) is applied")
    p.add_argument("--outliers", type=int, default=None, metavar="N",
                   help="the recipe's input channels per layer kept out of the int8 "
                   "activations (default: 32, at most K / 16; 0: none). They cost speed "
                   "where W8A8 kernels run (one float product per layer): 0.97x the plain "
                   "W8A8 model on a CPU, 0.68-0.80x at prefill and 0.50x at batched decode "
                   "on an H100 (docs/accuracy.md)")
    p.add_argument("--skip", nargs="*", metavar="PATTERN", default=None,
                   help="layers kept off W8A8 (path, suffix such as lm_head or down_proj, "
                   "or glob); default: lm_head; give --skip alone to skip nothing")
    p.add_argument("--sqnr-floor", type=float, metavar="DB",
                   help="keep off W8A8 every layer whose W8A8 SQNR on the calibration data "
                   "is below DB (needs --calibration): the recipe's floor (default: 25; "
                   "33 kept 20 of SmolLM2-135M's 210 layers and 5 of Gemma-3-270M's 126 "
                   "on W8A16 and halved their perplexity change, docs/accuracy.md); "
                   "with --smooth, the floor of the smoothed model's sensitivity report")
    p.add_argument("--keep", choices=KEEP, default="w8a16",
                   help="what skipped layers become (default: w8a16)")
    p.add_argument("--group-size", type=int, default=64, choices=GROUP_SIZES,
                   help="weights per scale of layers quantized from float, and of the "
                   "W8A16 layers (default: 64)")
    p.add_argument("--per-channel", action="store_true",
                   help="requantize the group-wise layers of an mlx-lm 8-bit or 4-bit --model "
                   "to per-channel int8 (the fastest W8A8 kernels; 4-bit weights double) and "
                   "print what it cost (weight SQNR and bytes; logits SQNR on the "
                   "calibration text when given)")
    p.add_argument("--grouped", action="store_true",
                   help="group-wise affine weights instead of symmetric per-channel int8")
    p.add_argument("--act-groups", action="store_true",
                   help="one int8 activation scale per token and weight group "
                   "(mlx_w8a8.Linear.act_scales = 'group'; implies --grouped): closer to "
                   "W8A16 where a few activation channels are large (docs/accuracy.md)")
    p.add_argument("--seq-len", type=int, default=256,
                   help="calibration sequence length in tokens, >= 2 (default: 256)")
    p.add_argument("--samples", type=int, default=4,
                   help="calibration sequences, >= 1 (default: 4, what docs/accuracy.md's "
                   "results used; more sequences cost one forward pass each)")
    p.add_argument("--batch-size", type=int, default=4,
                   help="calibration sequences per forward pass, >= 1 (default: 4)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``); returns the exit status
    (2 for a refused argument or a conversion error)."""
    parser = _parser()
    args = parser.parse_args(argv)
    skip = ["lm_head"] if args.skip is None else args.skip
    try:  # every argument, before minutes of loading and calibrating
        check_convert_arguments(args.model, args.out, args.smooth, args.calibration,
                                args.sqnr_floor, args.keep, args.group_size, args.seq_len,
                                args.samples, args.batch_size, args.force)
    except ValueError as error:
        parser.error(str(error))  # exit status 2
    if args.outliers is not None and args.outliers < 0:
        parser.error(f"--outliers must be >= 0, got {args.outliers}")
    if args.outliers is not None and (args.calibration is None or args.smooth is not None):
        parser.error("--outliers sets the recipe's outlier channels: it needs --calibration "
                     "and no --smooth")
    if args.per_channel and (args.grouped or args.act_groups):
        parser.error("--per-channel (requantize group-wise layers per channel) and --grouped "
                     "or --act-groups (group-wise weights) contradict each other; give one")
    try:
        convert(
            args.model, args.out, args.smooth, args.calibration, skip,
            args.sqnr_floor, args.keep, args.group_size,
            not (args.grouped or args.act_groups),
            args.seq_len, args.samples, args.batch_size, force=args.force,
            requantize_per_channel=args.per_channel,
            act_scales="group" if args.act_groups else "token",
            outliers=args.outliers,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
