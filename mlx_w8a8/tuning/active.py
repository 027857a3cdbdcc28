"""The process-wide tuner: the one every layer, op and model check consults.

Its own module so that the tuning modules that need the process-wide tuner
(:mod:`.batch`, the model checks) import it without importing the package that
re-exports them (``mlx_w8a8.tuning`` re-exports :func:`get_tuner`, :func:`use_tuner`
and :func:`set_tuning_table`). Every assignment of the tuner holds ``_lock``.
"""

from __future__ import annotations

import os
import threading

from ..kernels import registry
from .tuner import Tuner

_tuner: Tuner | None = None
_lock = threading.Lock()


def get_tuner() -> Tuner:
    """The process-wide tuner (created on first use from the environment)."""
    global _tuner
    if _tuner is None:
        with _lock:
            if _tuner is None:
                _tuner = Tuner()
    return _tuner


def use_tuner(tuner: Tuner | None) -> Tuner | None:
    """Make ``tuner`` the process-wide tuner (``None``: a fresh one from the environment
    on next use); layers re-decide. Returns the previous one."""
    global _tuner
    with _lock:
        previous, _tuner = _tuner, tuner
    registry.invalidate()
    return previous


def set_tuning_table(path: str | os.PathLike | None) -> None:
    """Name the tuning table read first and written by tuning.

    Args:
        path: a JSON table path; ``None`` goes back to ``$MLX_W8A8_TUNING_TABLE`` (or
            no named table). The cache and shipped tables stay below it.

    Raises:
        ValueError: when ``path`` is neither ``None``, a ``str`` nor an ``os.PathLike``.
    """
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise ValueError(
            f"[mlx_w8a8.set_tuning_table] path must be a str, an os.PathLike or None, "
            f"got {path!r} ({type(path).__name__})"
        )
    global _tuner
    with _lock:
        online = _tuner.online if _tuner is not None else None
        config = _tuner.config if _tuner is not None else None
        _tuner = Tuner(table_path=os.fspath(path) if path is not None else None,
                       online=online, config=config)
    registry.invalidate()  # layers re-decide with the new table
