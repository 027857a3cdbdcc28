"""``python -m mlx_w8a8.generate``: mlx-lm's ``generate`` command with W8A8 layers.

Every flag of ``mlx_lm.generate`` works as there (``--model``, ``--prompt``,
``--max-tokens``, ``--temp``, ``--draft-model``...); the model is converted to
``mlx_w8a8.Linear`` layers as it loads (:mod:`mlx_w8a8.serving`), and one line saying
which kernels run goes to stderr. Examples::

    python -m mlx_w8a8.generate --model path/to/w8a8-folder --prompt "hello" --max-tokens 64
    python -m mlx_w8a8.generate --model path/to/float-folder --quantize --prompt "hello"
    python -m mlx_w8a8.generate --tuning-table app/tuning.json --model ... --prompt ...

The mlx_w8a8 flags (``--quantize``, ``--q-group-size``, ``--tuning-table``,
``--kernel``, ``--warm-up-tokens``) are read first; the rest goes to mlx-lm's parser.
Exit status 2 for a model that cannot run W8A8 (its error on stderr).
"""

from __future__ import annotations

import sys

PROG = "python -m mlx_w8a8.generate"


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    from . import serving

    argv = list(sys.argv[1:] if argv is None else argv)
    options, rest, wants_help = serving.split_argv(PROG, argv)
    if wants_help:
        serving.print_help(PROG)
    # One generation compiles what it runs anyway: no warm-up unless asked for.
    options = options._replace(warm_up_tokens=options.warm_up_tokens or 0)
    try:
        module = serving.mlx_lm_module(PROG, "mlx_lm.generate")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return serving.exit_status(PROG, lambda: serving.run_main(module, PROG, rest, options, _log))


if __name__ == "__main__":
    raise SystemExit(main())
