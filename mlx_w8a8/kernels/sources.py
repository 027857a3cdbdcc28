"""Kernel source files under ``mlx_w8a8/shaders/{metal,cuda}/``, read once and digested.

Kernel bodies live in files (not Python strings) so they can be compiled by tests
outside MLX (``nvcc`` for CUDA, the host C++ compiler for Metal) exactly as shipped.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import resources


@functools.lru_cache(maxsize=None)
def read(backend: str, filename: str) -> str:
    """The text of ``shaders/<backend>/<filename>``.

    Raises:
        ValueError: if the file is not shipped with the package.
    """
    path = resources.files("mlx_w8a8").joinpath("shaders", backend, filename)
    if not path.is_file():
        raise ValueError(f"[mlx_w8a8] no kernel source shaders/{backend}/{filename}")
    return path.read_text(encoding="utf-8")


def digest(*parts: str) -> str:
    """A short, stable digest of ``parts`` (kernel sources and launch parameters)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]
