"""Kernel candidates, one module per backend; each registers what this machine can run.

Importing this package never fails for a missing backend: a backend module that cannot
load (no CUDA, no Metal) registers nothing and the reason is kept in ``UNAVAILABLE``.
"""

from __future__ import annotations

import importlib

from . import reference, registry  # noqa: F401  (the pure-MLX candidates always exist)

UNAVAILABLE: dict[str, str] = {}

for _backend in ("cuda", "metal"):
    try:
        importlib.import_module(f"{__name__}.{_backend}")
    except ModuleNotFoundError as error:
        if error.name != f"{__name__}.{_backend}":
            UNAVAILABLE[_backend] = f"{type(error).__name__}: {error}"
    except Exception as error:  # a backend that fails to load offers no candidates
        UNAVAILABLE[_backend] = f"{type(error).__name__}: {error}"
