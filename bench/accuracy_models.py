"""Perplexity of a pretrained model (``python -m mlx_w8a8.fetch``) as float, mlx-lm 8-bit
(W8A16), W8A8 per-channel, W8A8 group-wise, W8A8 with the recipe, mlx-lm 4-bit (W4A16)
and that 4-bit model on W4A8, each W8A8 / W4A8 form of an mlx-lm model also with
activation groups (``act_scales="group"``, the ``*_act_groups`` variants), on local texts.

Every variant is built once from the float folder, cast to ``--dtype``, and measured on
every text with :func:`mlx_w8a8.evaluation.perplexity` (the same windows for each variant).
W8A8 layers run the exact kernels (``exact``, ``exact_w4a8``, ``exact_act_groups``). The recipe is calibrated on ``--calibration``
(a file or ``builtin``), never on an evaluation text. Results are appended as JSON lines
as soon as each is measured.

    python bench/accuracy_models.py --model smollm2 --texts prose.txt code.txt \\
        --calibration builtin --json results.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

import mlx_w8a8 as w8
from mlx_w8a8 import requantize
from mlx_w8a8.evaluation import DTYPES, perplexity
from mlx_w8a8.recipe import FLOOR_DB, OUTLIERS, calibration_tokens, recipe
from mlx_w8a8.tokens import batches, text_tokens

VARIANTS = ("float", "w8a8", "recipe", "w8a16", "w8a8_grouped", "w8a8_grouped_recipe",
            "w8a8_requantized", "w8a8_requantized_recipe", "w8a8_act_groups", "w4a16", "w4a8",
            "w4a8_recipe", "w4a8_act_groups", "w8a8_requantized4", "w8a8_requantized4_recipe")
# built from the mlx-lm N-bit model (gs 64), as its checkpoints hold it; *_requantized*:
# its group-wise layers then requantized to per-channel int8 (load(per_channel=True)),
# from the 4-bit model for w8a8_requantized4
FROM_CHECKPOINT = ("w8a16", "w8a8_grouped", "w8a8_grouped_recipe", "w8a8_requantized",
                   "w8a8_requantized_recipe", "w8a8_act_groups", "w4a16", "w4a8", "w4a8_recipe",
                   "w4a8_act_groups", "w8a8_requantized4", "w8a8_requantized4_recipe")
FROM_4BIT = ("w4a16", "w4a8", "w4a8_recipe", "w4a8_act_groups", "w8a8_requantized4",
             "w8a8_requantized4_recipe")


def dequantized(model: nn.Module) -> nn.Module:
    """Each ``nn.QuantizedLinear`` replaced by an ``nn.Linear`` holding its dequantized
    weights: the same weight-only (W8A16 / W4A16) math as ``mx.quantized_matmul``, as a
    float product (MLX's CPU ``quantized_matmul`` is many times slower than its float
    product with a tuned BLAS)."""
    swaps = []
    for path, m in model.named_modules():
        if type(m) is nn.QuantizedLinear:
            w = mx.dequantize(m.weight, m.scales, m.biases, group_size=m.group_size, bits=m.bits)
            lin = nn.Linear(w.shape[1], w.shape[0], bias="bias" in m)
            lin.weight = w.astype(m.scales.dtype)
            if "bias" in m:
                lin.bias = m.bias
            swaps.append((path, lin))
    model.update_modules(tree_unflatten(swaps))
    return model


def build(folder: Path, variant: str, dtype, calib, log, dequantize: bool = False,
          floor_db: float = FLOOR_DB, outliers: int = OUTLIERS) -> nn.Module:
    from mlx_lm.utils import load_model

    model = load_model(folder)[0]
    model.set_dtype(dtype)
    if variant == "float":
        return model
    if variant in FROM_CHECKPOINT:
        nn.quantize(model, group_size=64, bits=4 if variant in FROM_4BIT else 8,
                    class_predicate=lambda p, m: isinstance(m, nn.Linear) and m.weight.shape[-1] % 64 == 0)
        skip = {"lm_head": "w8a16"}
        with_recipe = variant.endswith("_recipe")
        if with_recipe:  # stored layers scored; those below the floor kept
            chosen = recipe(model, calib, floor_db=floor_db, outliers=outliers)
            log(chosen.summary())
            skip.update(chosen.keep)
        if variant.endswith("act_groups"):  # one int8 scale per token and weight group
            w8.quantize(model, skip=skip, act_scales="group", kernel="exact_act_groups")
        elif variant.startswith("w4a8"):  # its 4-bit layers as stored, on the exact W4A8 kernel
            w8.quantize(model, skip=skip, kernel="exact_w4a8")
        elif variant.startswith("w8a8"):  # its layers as stored (group-wise), per-token
            w8.quantize(model, skip=skip, kernel="exact")
            if "requantized" in variant:
                log(requantize.per_channel(model).describe())
        if with_recipe:
            chosen.apply(model)
        return dequantized(model) if dequantize else model
    skip = {"lm_head": "w8a16"}  # the convert command's default
    if variant == "recipe":
        chosen = recipe(model, calib, floor_db=floor_db, outliers=outliers)
        log(chosen.summary())
        skip.update(chosen.keep)
    w8.quantize(model, skip=skip, kernel="exact")
    if variant == "recipe":
        chosen.apply(model)
    return dequantized(model) if dequantize else model


def text_windows(folder: Path, texts, seq_len: int, count: int, calibration: str,
                 calib_windows: int, bos: bool):
    """``({text: [B, T] windows}, [calibration batches])``: ``count`` windows of
    ``seq_len`` tokens per text, ``calib_windows`` of the calibration text, each window
    starting with the model's BOS token (``config.json``) when ``bos``."""
    data = {t: batches(text_tokens(t, folder), seq_len, count, count) for t in texts}
    calib = batches(calibration_tokens(calibration, folder), seq_len, 4, calib_windows)
    if bos:
        token = json.loads((folder / "config.json").read_text())["bos_token_id"]

        def with_bos(b):
            return mx.concatenate([mx.full((b.shape[0], 1), token, b.dtype), b[:, :-1]], axis=1)

        data = {t: [with_bos(b) for b in v] for t, v in data.items()}
        calib = [with_bos(b) for b in calib]
    return data, calib


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="float mlx-lm folder (python -m mlx_w8a8.fetch)")
    p.add_argument("--texts", nargs="+", required=True, help="evaluation text files")
    p.add_argument("--calibration", default="builtin", help="calibration file or 'builtin'")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--windows", type=int, default=2, help="windows per text")
    p.add_argument("--calib-windows", type=int, default=4)
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--bos", action="store_true",
                   help="start every window with the model's BOS token (config.json "
                   "bos_token_id): Gemma needs it")
    p.add_argument("--dequantize", action="store_true",
                   help="run W8A16 / W4A16 layers as float products of their dequantized "
                   "weights (the same math; on a CPU much faster than quantized_matmul)")
    p.add_argument("--recipe-floor", type=float, default=FLOOR_DB,
                   help=f"the recipe variant's W8A16 floor in dB (default: the recipe's, {FLOOR_DB})")
    p.add_argument("--recipe-outliers", type=int, default=OUTLIERS,
                   help=f"the recipe variants' outlier channels per layer (default: the "
                   f"recipe's, {OUTLIERS}; 0: none)")
    p.add_argument("--json", help="append results as JSON lines")
    args = p.parse_args(argv)
    folder = Path(args.model)

    def log(line):
        print(line, flush=True)

    data, calib = text_windows(folder, args.texts, args.seq_len, args.windows,
                               args.calibration, args.calib_windows, args.bos)
    for variant in args.variants.split(","):
        start = time.time()
        model = build(folder, variant, DTYPES[args.dtype], calib, log, args.dequantize,
                      args.recipe_floor, args.recipe_outliers)
        built = time.time() - start
        for text, windows in data.items():
            t0 = time.time()
            ppl, count = perplexity(model, windows)
            row = {"model": folder.name, "variant": variant, "text": Path(text).name, "bos": args.bos,
                   "perplexity": ppl, "tokens": count, "seq_len": args.seq_len,
                   "dtype": args.dtype, "dequantize": args.dequantize, "build_s": round(built, 1),
                   **({"recipe_floor_db": args.recipe_floor, "recipe_outliers": args.recipe_outliers}
                      if variant.endswith("recipe") else {}),
                   "eval_s": round(time.time() - t0, 1)}
            log(json.dumps(row))
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
        del model
        mx.clear_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
