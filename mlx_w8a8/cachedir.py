"""This package's cache directory and the writable folders under it.

``$MLX_W8A8_CACHE_DIR`` or the platform's user cache folder
(``platformdirs.user_cache_dir("mlx_w8a8")``). The tuner keeps its user table and lock
files there (:mod:`mlx_w8a8.tuning`), the CUDA launchers the kernel headers NVRTC
includes (:mod:`mlx_w8a8.kernels.cuda.launch`). Where it cannot be written, a folder of
the system temporary directory stands in. :func:`write_text_atomic` is how every such
file (and a tuning table anywhere) is written.
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Callable

try:  # a declared dependency; a missing one must not break ``import mlx_w8a8``
    import platformdirs
except ImportError:  # pragma: no cover - exercised on minimal images
    platformdirs = None

ENV_CACHE_DIR = "MLX_W8A8_CACHE_DIR"


def cache_dir() -> str:
    """The user's cache directory of this package: ``$MLX_W8A8_CACHE_DIR`` or the
    platform cache directory (``platformdirs.user_cache_dir("mlx_w8a8")``)."""
    base = os.environ.get(ENV_CACHE_DIR)
    if base:
        return base
    if platformdirs is not None:
        return platformdirs.user_cache_dir("mlx_w8a8")
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "mlx_w8a8")  # what platformdirs gives on Linux


def folder(kind: str) -> str:
    """``<cache dir>/<kind>``, created; the temporary directory's
    ``mlx_w8a8-<user>/<kind>`` if that fails.

    Raises:
        OSError: if neither can be created and written.
    """
    for base in (cache_dir(), os.path.join(tempfile.gettempdir(), f"mlx_w8a8-{_user()}")):
        path = os.path.join(base, kind)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            continue
        if os.access(path, os.W_OK):
            return path
    raise OSError(f"[mlx_w8a8] no writable folder for {kind} (tried {cache_dir()!r} and the "
                  f"temporary directory); set {ENV_CACHE_DIR} to a writable folder")


def _user() -> str:
    try:
        return str(os.getuid())
    except AttributeError:  # pragma: no cover - Windows
        return os.environ.get("USERNAME", "user")


def write_text_atomic(path: str, text: str, replace_if: Callable[[], bool] | None = None) -> bool:
    """Replace ``path`` by a file holding ``text``, whole or not at all.

    The text goes to a temporary file of its own in the same folder (so concurrent
    writers, threads or processes, never share one), is flushed to disk and renamed
    over ``path``. An existing file keeps its permission bits; a new one gets what the
    umask gives (``mkstemp`` alone would make it 0600).

    Args:
        path: the file to replace.
        text: its new contents.
        replace_if: asked after the text is on disk, right before the rename; if it
            returns ``False`` the temporary file is removed and ``path`` left as it is
            (a writer that finds the file changed since it read it merges again).

    Returns:
        Whether ``path`` was replaced.

    Raises:
        OSError: if the folder cannot be written; no temporary file is left behind.
    """
    folder = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=".w8a8-", suffix=".tmp", dir=folder)
    try:
        os.chmod(tmp, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if replace_if is not None and not replace_if():
            os.unlink(tmp)
            return False
        os.replace(tmp, path)
        return True
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_umask_lock = threading.Lock()


def umask() -> int:
    """The process umask: what new files' and folders' permission bits lose."""
    return _umask()


def _umask() -> int:
    """The process umask (read without changing it where the OS says it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _umask_lock:  # set and restore: brief, and serialized within the process
        mask = os.umask(0o022)
        os.umask(mask)
    return mask
