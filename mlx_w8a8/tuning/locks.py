"""The tuner's lock files, kept in the user cache directory (never beside a table).

Three kinds, all ``filelock`` locks under ``<cache dir>/locks/``:

- **table locks** (:func:`table_lock`): one per table file, named by a digest of its
  real path, held while a write re-reads, merges and replaces the table;
- **claims** (:func:`claim_lock`): one per tuning key, non-blocking: the tuner that
  holds it measures that key, the others keep the fallback;
- **device locks** (:func:`device_lock`): one per device (backend and unit), held for a
  whole measurement, so two processes never time kernels on one GPU at once. The
  holder writes ``<lock>.owner`` (pid, host, command, since) and a waiter that gives up
  says who holds it.

A table shipped in a read-only package or shared on a network folder thus gets no
``.lock`` or ``.claims`` files next to it; the price is that two writers with different
cache directories (two users, or ``MLX_W8A8_CACHE_DIR`` per process) writing one table
do not exclude each other: the table's ``os.replace`` keeps it whole either way, a
writer that finds the file replaced since it read it merges again
(:func:`.table.write_entries`), and ``tune`` writes again what another writer dropped
(:meth:`.tuner.Tuner.ensure_recorded`); they may measure the same keys twice.
If the cache directory cannot be written, the lock files go to the system temporary
directory.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import socket
import sys
from typing import Any, Iterator

import mlx.core as mx

from ..cachedir import folder as _folder

try:  # a declared dependency; a missing one must not break ``import mlx_w8a8``
    import filelock
except ImportError:  # pragma: no cover
    filelock = None

# How long a table write waits for another writer (writes take milliseconds).
TABLE_TIMEOUT_S = 120.0
# How long a measurement waits for another process measuring on the same device.
DEVICE_TIMEOUT_S = 600.0
# mx.device_info() keys that are state, not identity (free memory changes per call).
_STATE_KEYS = ("free",)


class DeviceBusy(RuntimeError):
    """Another process kept the device lock past the timeout; the message names it."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def _require_filelock(what: str) -> None:
    if filelock is None:
        raise OSError(f"{what}: the 'filelock' package is not installed")


def table_lock(path: str) -> Any:
    """The lock guarding read-modify-write of the table at ``path`` (not yet held).

    Raises:
        OSError: if ``filelock`` is missing or no lock folder can be written.
    """
    _require_filelock(path)
    name = _digest(os.path.realpath(path)) + ".lock"
    return filelock.FileLock(os.path.join(_folder("locks"), name), timeout=TABLE_TIMEOUT_S)


def claim_lock(key: str) -> Any:
    """The non-blocking claim lock of tuning key ``key`` (not yet held).

    Raises:
        OSError: if ``filelock`` is missing or no lock folder can be written.
    """
    _require_filelock(key)
    return filelock.FileLock(os.path.join(_folder("claims"), key + ".lock"), timeout=0)


def device_name(device: Any = None) -> str:
    """A readable name of ``device`` (default: the default device)."""
    device = device if device is not None else mx.default_device()
    try:
        model = mx.device_info(device).get("device_name", "")
    except Exception:
        model = ""
    return f"{_label(device)}" + (f" ({model})" if model else "")


def device_id(device: Any = None) -> str:
    """What names one physical device on this host: its type and index, the unit's
    own identity where MLX reports one (UUID, PCI bus id) and the CUDA device mask,
    without state such as free memory."""
    device = device if device is not None else mx.default_device()
    try:
        info = mx.device_info(device)
    except Exception:
        info = {}
    ident = {str(k): str(v) for k, v in info.items() if not any(w in str(k).lower() for w in _STATE_KEYS)}
    return json.dumps([_label(device), ident, os.environ.get("CUDA_VISIBLE_DEVICES")], sort_keys=True)


def _label(device: Any) -> str:
    """``"cpu 0"``, ``"gpu 1"``: type and index (``str(mx.Device)`` is ``Device(gpu, 1)``)."""
    text = str(device)
    inner = text[text.find("(") + 1 : text.rfind(")")] if "(" in text else text
    return " ".join(part.strip() for part in inner.split(","))


def _owner_text(device: Any) -> str:
    return json.dumps({
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv)[:300],
        "since": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "device": device_name(device),
    })


def owner(lock_path: str) -> dict | None:
    """The holder recorded beside a device lock (``None`` if none is recorded)."""
    try:
        with open(lock_path + ".owner", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def device_lock(device: Any = None, timeout: float | None = None) -> Iterator[str | None]:
    """Hold the measuring lock of ``device`` (default: the default device).

    Yields the lock file's path (``None`` when ``filelock`` is not installed: then
    nothing is locked).

    Raises:
        DeviceBusy: after ``timeout`` seconds (default :data:`DEVICE_TIMEOUT_S`),
            naming the process that holds the device (pid, host, command, since).
    """
    if filelock is None:
        yield None
        return
    timeout = DEVICE_TIMEOUT_S if timeout is None else timeout
    path = os.path.join(_folder("locks"), "device-" + _digest(device_id(device)) + ".lock")
    lock = filelock.FileLock(path, timeout=timeout)
    try:
        lock.acquire()
    except filelock.Timeout:
        who = owner(path)
        held = (
            f"pid {who.get('pid')} on {who.get('host')} running {who.get('command')!r} "
            f"since {who.get('since')}" if who else "another process (no owner recorded)"
        )
        raise DeviceBusy(
            f"[mlx_w8a8.tuning] {device_name(device)} is being measured by {held}; waited "
            f"{timeout:g} s (lock {path})"
        ) from None
    try:
        try:
            with open(path + ".owner", "w", encoding="utf-8") as f:
                f.write(_owner_text(device))
        except OSError:
            pass
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path + ".owner")
        lock.release()
