"""Kernel source files under ``mlx_w8a8/shaders/{metal,cuda}/``, read once and digested.

Kernel bodies live in files (not Python strings) so they can be compiled by tests
outside MLX (``nvcc`` for CUDA, the host C++ compiler for Metal) exactly as shipped.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from importlib import resources
from typing import Callable


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


def code_digest(*functions: Callable, texts: tuple[str, ...] = (), params: str = "") -> str:
    """The digest of one candidate: the source of the Python functions it runs, the
    kernel texts it compiles and its launch parameters.

    Only what the candidate executes is hashed (not whole modules), so editing a
    comment elsewhere in a backend module does not make tuning tables stale, while
    editing a function the candidate calls does.

    Args:
        functions: the candidate's ``run`` and the package functions it calls.
        texts: kernel source texts (e.g. from :func:`read`).
        params: launch parameters and constants, as text.
    """
    return digest(*(_source(f) for f in functions), *texts, params)


def _source(function: Callable) -> str:
    """The source text of ``function``; its compiled code where no source ships (a
    frozen or byte-compiled-only install), so the digest still follows changes."""
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        code = function.__code__
        return f"{code.co_code.hex()} {code.co_consts!r} {code.co_names!r}"
