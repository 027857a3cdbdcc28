"""Kernel candidates, one module per backend; each registers what this machine can run.

Importing this package never fails for a missing backend. A backend that is simply not
built for this machine (its module imports nothing it needs) registers nothing, quietly.
A backend module that exists but fails to import (a missing dependency, a syntax error)
is loud: one ``RuntimeWarning`` naming the backend and the error, the reason kept in
``UNAVAILABLE`` (:func:`unavailable`, shown by ``mlx_w8a8.available_kernels`` callers
and ``check``) and logged at debug level on every kernel lookup, since every call then
runs the pure-MLX kernels.
"""

from __future__ import annotations

import importlib
import logging
import sys
import warnings

from . import dequant_matmul, reference, registry  # noqa: F401  (the pure-MLX candidates always exist)

log = logging.getLogger("mlx_w8a8.kernels")

BACKENDS = ("cuda", "metal")
# backend -> "ExceptionType: message" for each backend module that failed to import.
UNAVAILABLE: dict[str, str] = {}


def unavailable() -> dict[str, str]:
    """``{backend: reason}`` for each backend module that failed to import (a copy)."""
    return dict(UNAVAILABLE)


def capabilities(backend: str | None = None) -> dict[str, tuple[bool, str]]:
    """``{capability: (on, why)}`` of the backend modules that imported (each module's
    ``status()``: Metal's ``metal`` and ``nax``, CUDA's ``cuda_sm90`` and ``cuda_tma``),
    in ``BACKENDS`` order; only ``backend``'s with ``backend`` (``{}`` for one without
    kernels of its own, e.g. ``"cpu"``). A capability that is off takes its candidates
    out of every decision and every tuning race, so callers show it with its reason."""
    caps: dict[str, tuple[bool, str]] = {}
    for name in BACKENDS if backend is None else (backend,):
        module = sys.modules.get(f"{__name__}.{name}")
        if name not in UNAVAILABLE and module is not None:
            caps.update(module.status())
    return caps


def _load(backend: str) -> None:
    name = f"{__name__}.{backend}"
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name:  # a dependency is missing (the module itself is shipped)
            _fail(backend, error)
    except Exception as error:  # a backend that fails to load offers no candidates
        _fail(backend, error)


def _fail(backend: str, error: Exception) -> None:
    """Record and warn (once: a module import runs once per process)."""
    reason = f"{type(error).__name__}: {error}"
    UNAVAILABLE[backend] = reason
    warnings.warn(
        f"[mlx_w8a8.kernels] the {backend} backend failed to import ({reason}); its "
        f"kernels are unavailable and the pure-MLX kernels run instead",
        RuntimeWarning,
        stacklevel=3,
    )


def _report_on_lookup(problem) -> None:
    if UNAVAILABLE:
        log.debug(
            "[mlx_w8a8.kernels] %s: backends unavailable here: %s", problem.op,
            "; ".join(f"{b} ({r})" for b, r in sorted(UNAVAILABLE.items())),
        )


for _backend in BACKENDS:
    _load(_backend)
registry.set_capabilities(capabilities)
if UNAVAILABLE:  # no cost on the hot path when every backend loaded
    registry.set_lookup_hook(_report_on_lookup)
