"""Perplexity of a model on local text: ``python -m mlx_w8a8.eval --model DIR --text FILE``.

The text is cut into non-overlapping windows of ``--seq-len`` tokens; perplexity is
``exp`` of the mean next-token negative log-likelihood over every predicted token.
Side by side (``--variants``) a float folder is evaluated as it is (``float``, cast to
``--dtype``, bfloat16 by default), with its linear layers on mlx-lm's 8-bit weights
(``w8a16``: ``nn.QuantizedLinear``, 8 bits, group size 64; embeddings stay float) and
as W8A8 (``w8a8``: :func:`mlx_w8a8.quantize` of the cast model); a W8A8 checkpoint as
W8A8 and as stock mlx-lm loads it (``w8a16``). W8A8 layers run the exact W8A8 math unless ``--kernel``
names another W8A8 candidate: the tuner's default may run ``mlx_qmm``, which is W8A16.

The command line only: the evaluation is :mod:`mlx_w8a8.evaluation` (``perplexity``,
``load_variant``), whose names are re-exported here for code that imports them from
``mlx_w8a8.eval``; the package itself never imports this module.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .evaluation import DTYPES, VARIANTS, load_variant, perplexity, use_kernel
from .sensitivity import EXACT
from .tokens import batches, text_tokens

__all__ = ["DTYPES", "EXACT", "VARIANTS", "check_arguments", "load_variant", "main",
           "perplexity", "use_kernel"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mlx_w8a8.eval",
        description="Perplexity of a model on a local text file (float / mlx-lm 8-bit / "
        "W8A8 side by side with --variants float,w8a16,w8a8).",
    )
    p.add_argument("--model", required=True, help="model folder (float, or a W8A8 checkpoint)")
    p.add_argument("--text", required=True, help="local UTF-8 text file")
    p.add_argument("--variants", default=None,
                   help=f"comma-separated, among {','.join(VARIANTS)}; default: float for a "
                   f"float folder, w8a8 for a quantized one")
    p.add_argument("--seq-len", type=int, default=512,
                   help="tokens per window, >= 2; each window predicts its tokens 2..T "
                   "(default: 512)")
    p.add_argument("--batch-size", type=int, default=4,
                   help="windows per forward pass, >= 1 (default: 4)")
    p.add_argument("--samples", type=int, default=None,
                   help="at most this many windows, >= 1 (default: every full window)")
    p.add_argument("--dtype", choices=list(DTYPES), default="bfloat16",
                   help="float folders are cast to this first (default: bfloat16)")
    p.add_argument("--kernel", default=EXACT,
                   help=f"W8A8 candidate for W8A8 layers (default: {EXACT}, the exact math)")
    p.add_argument("--json", metavar="FILE", help="also append the results as JSON lines")
    return p


def check_arguments(args) -> list[str]:
    """The variants to run, after checking every argument of the command line before
    any model is loaded.

    Raises:
        ValueError: naming the argument, the value and what is valid.
    """
    op = "mlx_w8a8.eval"
    folder = Path(args.model)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"[{op}] cannot read {folder / 'config.json'}: {error}") from None
    quantized = "quantization" in config
    if args.variants is None:
        variants = ["w8a8" if quantized else "float"]
    else:
        # "bf16" is accepted for the float variant (cast to --dtype, bfloat16 by default).
        names = [v.strip() for v in args.variants.split(",") if v.strip()]
        variants = ["float" if v == "bf16" else v for v in names]
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown or not variants:
            raise ValueError(f"[{op}] --variants takes a comma-separated list among "
                             f"{','.join(VARIANTS)}, got {args.variants!r}")
    if "float" in variants and quantized:
        raise ValueError(f"[{op}] {folder} is a quantized checkpoint; the float variant needs "
                         f"the float model folder")
    text = Path(args.text)
    if not text.is_file() or text.stat().st_size == 0:
        raise ValueError(f"[{op}] --text must be a non-empty text file, got {args.text!r}")
    for flag, value, low in (("--seq-len", args.seq_len, 2), ("--batch-size", args.batch_size, 1),
                             ("--samples", args.samples, 1)):
        if value is not None and value < low:
            raise ValueError(f"[{op}] {flag} must be >= {low}, got {value}")
    if {"w8a8", "w8a8_act_groups"} & set(variants) and args.kernel is not None:
        from .kernels import registry

        try:
            registry.get("linear", args.kernel)
        except ValueError as error:  # names the known kernels
            raise ValueError(f"[{op}] --kernel {args.kernel!r}: {error}") from None
    if args.json and not Path(args.json).absolute().parent.is_dir():
        raise ValueError(f"[{op}] --json FILE: the folder of {args.json!r} does not exist")
    return variants


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``); returns the exit status
    (2 for a refused argument or an evaluation error)."""
    parser = _parser()
    args = parser.parse_args(argv)
    folder = Path(args.model)
    try:  # every argument, before minutes of loading and evaluating
        variants = check_arguments(args)
    except ValueError as error:
        parser.error(str(error))  # exit status 2
    try:
        tokens = text_tokens(args.text, folder)
        data = batches(tokens, args.seq_len, args.batch_size, args.samples)
        results = []
        for variant in variants:
            model = load_variant(folder, variant, args.kernel, args.dtype)
            ppl, count = perplexity(model, data, progress=variant)
            results.append({"model": str(folder), "variant": variant, "perplexity": ppl,
                            "tokens": count, "seq_len": args.seq_len, "dtype": args.dtype,
                            "kernel": args.kernel if variant == "w8a8" else None})
            del model
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    base = results[0]["perplexity"]
    print(f"{'variant':<8} {'perplexity':>11} {'vs first':>9}  tokens")
    for r in results:
        print(f"{r['variant']:<8} {r['perplexity']:>11.4f} {100 * (r['perplexity'] / base - 1):>+8.2f}%  {r['tokens']}")
    if args.json:
        with open(args.json, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
