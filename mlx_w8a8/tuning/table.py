"""Tuning tables: versioned JSON files of measured choices, layered and shared.

A table file::

    {"schema": 1,
     "sections": [
       {"backend": "cpu", "device": {...mx.device_info()...},
        "mlx_version": "0.32.4", "package_version": "0.1.0",
        "entries": [{"op": "linear", "m_bucket": 1, "n": 14336, "k": 4096,
                     "dtype": "bfloat16", "weight_format": "per_channel",
                     "group_size": 64, "choice": "mlx_qmm", "candidates": {...}, ...}]}]}

A section's key is (backend, device identity, MLX version, package version); each entry
also records the source digest of every candidate it measured, and is only used while
those digests match the registered kernels. Sections and entries that do not match
this machine are kept (a table can serve many devices) but never used.

Layers, first hit wins: the table the user names (``MLX_W8A8_TUNING_TABLE`` or the API)
> the user's cache table (``platformdirs.user_cache_dir("mlx_w8a8")/tuning.json``, or
``$MLX_W8A8_CACHE_DIR/tuning.json``) > the tables shipped in ``mlx_w8a8/tables/``.

Writes take a file lock (in the user cache directory, :mod:`.locks`; nothing is written
beside the table but the table), re-read the file, merge the new entries in (replacing
only entries with the same key) and replace the file atomically (temporary file +
``os.replace``), so concurrent tuners sharing a cache directory never lose each other's
entries; writers with different cache directories do not share the lock, and a writer
that finds the file replaced since it read it merges again (:func:`account` tells a
writer afterwards what the file holds of its entries). A new table gets
the permissions the umask gives (``0644`` under ``022``), an existing one keeps its
own. A corrupt or unreadable table is reported once per process (one
``TuningTableWarning``) and skipped; it is never overwritten.

Entries are checked against one schema (:data:`ENTRY_SCHEMA`, :func:`entry_problems`):
an entry with a missing field, a field of the wrong type or out of range is skipped
where the table is read for use (:func:`load`, :func:`matching_entries`), reported once
per file, and kept as it is when the file is written again. Table warnings name the
file and the entry and point at the entry's line in the file, not at this package.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import warnings
from importlib import resources
from typing import Any, Iterable

import mlx.core as mx

from .. import backends, cachedir
from ..kernels.registry import ACT_SCALES, OPS, WEIGHT_FORMATS
from . import locks
from .timing import PRUNE_RATIO

log = logging.getLogger("mlx_w8a8.tuning")

SCHEMA = 1
ENV_TABLE = "MLX_W8A8_TUNING_TABLE"
ENV_CACHE_DIR = cachedir.ENV_CACHE_DIR
CACHE_FILE = "tuning.json"
ENTRY_FIELDS = ("op", "m_bucket", "n", "k", "dtype", "weight_format", "group_size", "choice")
DTYPES = ("float16", "bfloat16", "float32", "int8")
SECTION_FIELDS = ("backend", "device", "mlx_version", "package_version", "entries")


class TableError(Exception):
    """A table file that cannot be read as a tuning table (or written safely)."""


class TuningTableWarning(UserWarning):
    """A tuning table was skipped (corrupt) or holds entries this machine cannot use."""


# --- the entry schema -------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and value == value and value not in (float("inf"), float("-inf")))


# field -> (what it must be, check). The key fields (ENTRY_FIELDS) are required; the
# others are optional, checked where present (``None`` allowed where the tuner writes it).
ENTRY_SCHEMA: dict[str, tuple[str, Any]] = {
    "op": (f"one of {list(OPS)}", lambda v: v in OPS),
    "m_bucket": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
    "n": ("an integer >= 0", lambda v: _is_int(v) and v >= 0),
    "k": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
    "dtype": (f"one of {list(DTYPES)}", lambda v: v in DTYPES),
    "weight_format": (f"one of {list(WEIGHT_FORMATS)}", lambda v: v in WEIGHT_FORMATS),
    "group_size": ("null or an integer >= 1", lambda v: v is None or (_is_int(v) and v >= 1)),
    "choice": ("a non-empty string", lambda v: isinstance(v, str) and v != ""),
    "has_bias": ("true or false", lambda v: isinstance(v, bool)),
    "act_scales": (f"one of {list(ACT_SCALES)}", lambda v: v in ACT_SCALES),
    "m": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
    "candidates": ("an object of candidate name -> object", lambda v: isinstance(v, dict) and all(
        isinstance(name, str) and isinstance(c, dict) for name, c in v.items())),
    # The decode check's verdict; "batch" (absent: B = 1) names the batched decode of B
    # sequences that judged an M = B entry; "judged_in": "tuned" (absent: the group was
    # added to an all-reference model) says the group was taken off the tuned model.
    "decode_check": ("an object whose batch, where present, is an integer >= 2",
                     lambda v: isinstance(v, dict) and (
                         "batch" not in v or (_is_int(v["batch"]) and v["batch"] >= 2))),
}
# Per measured candidate (``entry["candidates"][name]``), where present.
CANDIDATE_SCHEMA: dict[str, tuple[str, Any]] = {
    "status": ("a string", lambda v: isinstance(v, str)),
    "digest": ("a string", lambda v: isinstance(v, str)),
    "median_ns": ("null or a finite number >= 0", lambda v: v is None or (_is_number(v) and v >= 0)),
    "rounds": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
    "unlinked_ns": ("a finite number >= 0", lambda v: _is_number(v) and v >= 0),
}


def entry_problems(entry: Any) -> list[str]:
    """What is wrong with ``entry`` as a table entry (empty: nothing), one phrase per
    field: missing key fields, fields of the wrong type or out of range."""
    if not isinstance(entry, dict):
        return [f"not an object ({type(entry).__name__})"]
    missing = [f for f in ENTRY_FIELDS if f not in entry]
    found = [f"lacks {missing}"] if missing else []
    for field, (want, ok) in ENTRY_SCHEMA.items():
        if field in entry and not ok(entry[field]):
            found.append(f"{field} is {entry[field]!r}, not {want}")
    candidates = entry.get("candidates")
    if isinstance(candidates, dict):
        for name, info in candidates.items():
            if not isinstance(info, dict):
                continue  # reported by the "candidates" check
            for field, (want, ok) in CANDIDATE_SCHEMA.items():
                if field in info and not ok(info[field]):
                    found.append(f"candidates[{name!r}].{field} is {info[field]!r}, not {want}")
    return found


def invalid_entries(doc: dict) -> list[tuple[int, int, list[str]]]:
    """``(section index, entry index, problems)`` of every invalid entry of ``doc``
    (a table that passed :func:`validate`)."""
    return [(i, j, problems)
            for i, section in enumerate(doc["sections"])
            for j, entry in enumerate(section["entries"])
            for problems in [entry_problems(entry)] if problems]


def _locate(text: str) -> tuple[Any, dict[tuple[int, int], int]]:
    """``(doc, {(section index, entry index): line})``: the JSON ``text`` of a table
    parsed with the pure-Python scanner (slower than ``json.loads``: for reports only),
    recording the 1-based line where each entry's object opens; ``(None, {})`` if it is
    not such a table."""
    import json.scanner

    starts: dict[int, int] = {}
    decoder = json.JSONDecoder()
    parse_object = decoder.parse_object

    def located(s_and_end, *args, **kwargs):
        obj, end = parse_object(s_and_end, *args, **kwargs)
        starts[id(obj)] = s_and_end[1] - 1  # the scanner passes the index after "{"
        return obj, end

    decoder.parse_object = located
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    try:
        doc = decoder.decode(text)
        found = {}
        for i, section in enumerate(doc["sections"]):
            for j, entry in enumerate(section["entries"]):
                if id(entry) in starts:
                    found[(i, j)] = text.count("\n", 0, starts[id(entry)]) + 1
        return doc, found
    except Exception:
        return None, {}


def entry_lines(text: str) -> dict[tuple[int, int], int]:
    """``{(section index, entry index): line}`` (1-based) where each entry's object
    opens in the JSON ``text`` of a table; ``{}`` if it is not such a table."""
    return _locate(text)[1]


def entry_line(path: str, entry: Any) -> int:
    """The 1-based line where the first entry equal to ``entry`` opens in the table file
    at ``path``; 0 where it cannot be found (the file changed, or cannot be read)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc, lines = _locate(f.read())
    except OSError:
        return 0
    for (i, j), line in sorted(lines.items()):
        if doc["sections"][i]["entries"][j] == entry:
            return line
    return 0


def describe_entry(entry: Any, i: int | None = None, j: int | None = None) -> str:
    """``section i entry j (op M=.. N=.. K=..)`` (``entry (...)`` without indices): how
    reports name an entry."""
    where = f"section {i} entry {j}" if i is not None else "entry"
    if isinstance(entry, dict):
        shape = " ".join(f"{label}={entry[f]!r}" for label, f in
                         (("M", "m_bucket"), ("N", "n"), ("K", "k")) if f in entry)
        return f"{where} ({entry.get('op', '?')} {shape})"
    return where


# --- identity -------------------------------------------------------------------------


# ``mx.device_info()`` keys that are not the device model: state that changes between
# processes (free memory) and the serial of one physical unit (a table measured on one
# H200 applies to every H200).
_NOT_IDENTITY = ("free", "uuid", "pci", "bus_id", "serial")


def device_identity(device: Any = None) -> dict[str, Any]:
    """The device model: ``mx.device_info()`` of ``device`` (default: the default
    device) without volatile or per-unit keys (free memory, UUID, PCI bus id),
    JSON-safe (values str or int)."""
    try:
        info = mx.device_info() if device is None else mx.device_info(device)
    except Exception as error:  # an old MLX or a device without info
        return {"device_name": f"unknown ({type(error).__name__})"}
    return {
        str(k): (v if isinstance(v, (int, str)) else str(v))
        for k, v in sorted(info.items())
        if not any(word in str(k).lower() for word in _NOT_IDENTITY)
    }


def device_key(device: Any = None) -> dict[str, Any]:
    """The section key of ``device``: backend, device model, MLX and package versions.

    ``device`` defaults to the device a call runs on: ``mx.default_device()``, which
    ``with mx.stream(s)`` (and the ``stream=`` of the ops) sets to the stream's device,
    so a process using the CPU and a GPU reads and writes each device's own section.
    Computed once per device and process; do not modify the returned dict.
    """
    device = backends.device(device)
    name = str(device)
    key = _device_keys.get(name)
    if key is None:
        from .._version import __version__

        key = {
            "backend": backends.name(device),
            "device": device_identity(device),
            "mlx_version": mx.__version__,
            "package_version": __version__,
        }
        _device_keys[name] = key
    return key


_device_keys: dict[str, dict[str, Any]] = {}


def section_key(section: dict) -> tuple:
    """A hashable form of a section's key."""
    return (
        section["backend"],
        json.dumps(section["device"], sort_keys=True),
        section["mlx_version"],
        section["package_version"],
    )


def entry_key(entry: dict) -> tuple:
    """``(op, m_bucket, n, k, dtype, weight_format, group_size, act_scales)`` of an entry."""
    return (*(entry[f] for f in ENTRY_FIELDS[:-1]), act_scales(entry))


def act_scales(entry: dict) -> str:
    """An entry's activation scaling (``Problem.act_scales``): its optional
    ``"act_scales"`` field, ``"token"`` where absent (every entry written before the
    field existed measured per-token kernels)."""
    return entry.get("act_scales", "token")


# --- paths ------------------------------------------------------------------------------


def pruned_within_reach(entry: dict) -> list[str]:
    """The candidates ``entry`` timed in one round (``"rounds": 1``, pruned) whose lone
    sample is within half the prune ratio of the fastest fully timed median.

    The tuner prunes on a whole first round at more than :data:`.timing.PRUNE_RATIO`
    times the fastest arm's, so its own entries show none (but for a fastest arm whose
    first round took under half its median). Tables written by the tuner that pruned
    on one warm launch can: on an NVIDIA H200 such a candidate, 1.04x the chosen
    kernel's median on its one sample, measured 0.88x its time over full rounds. An
    entry with one is re-measured by ``tune`` (:meth:`.tuner.Tuner.measured`), noted by
    ``tune --show``, and used as it stands until then."""
    # name -> (median, timed in one round) of the candidates timed ok
    timed = {name: (c["median_ns"], c.get("rounds") == 1)
             for name, c in (entry.get("candidates") or {}).items()
             if isinstance(c, dict) and c.get("status") == "ok"
             and isinstance(c.get("median_ns"), (int, float))}
    full = [ns for ns, one_round in timed.values() if not one_round]
    if not full:
        return []
    bar = min(full) * PRUNE_RATIO / 2
    return sorted(name for name, (ns, one_round) in timed.items() if one_round and ns < bar)


def cache_table_path() -> str:
    """The user's cache table: ``$MLX_W8A8_CACHE_DIR`` or the platform cache dir."""
    return os.path.join(cachedir.cache_dir(), CACHE_FILE)


def shipped_table_paths() -> list[str]:
    """The ``*.json`` tables shipped in ``mlx_w8a8/tables/``, sorted by name."""
    try:
        folder = resources.files("mlx_w8a8").joinpath("tables")
        found = [p for p in folder.iterdir() if p.name.endswith(".json") and p.is_file()]
    except Exception:
        return []
    return sorted(str(p) for p in found)


# --- reporting once ---------------------------------------------------------------------

_reported: set[tuple[str, str]] = set()
_report_lock = threading.Lock()


def report_once(path: str, kind: str, message: str, line: int = 0) -> None:
    """Warn (one ``TuningTableWarning``) once per (path, kind); the log gets it at
    debug level only, so a user with logging configured does not read it twice.

    The warning points at the table, not at this package: Python shows it as
    ``path:line: TuningTableWarning: ...`` (with the table's line ``line`` under it;
    ``line`` 0 shows no source line)."""
    with _report_lock:
        if (path, kind) in _reported:
            return
        _reported.add((path, kind))
    log.debug("%s", message)
    warnings.warn_explicit(message, TuningTableWarning, filename=str(path), lineno=int(line),
                           module="mlx_w8a8.tuning.table")


def reset_reports() -> None:
    """Forget which tables were reported (tests; a long-lived process after a fix)."""
    with _report_lock:
        _reported.clear()


# --- reading ----------------------------------------------------------------------------


def empty() -> dict:
    return {"schema": SCHEMA, "sections": []}


def validate(doc: Any, path: str = "<table>") -> dict:
    """Check that ``doc`` is a tuning table this package can read: its schema and the
    form of its sections. Entries are checked one by one (:func:`entry_problems`): an
    invalid entry does not make the table invalid.

    Raises:
        TableError: naming the path and what is wrong.
    """
    if not isinstance(doc, dict) or "schema" not in doc:
        raise TableError(f"{path}: not a tuning table (no 'schema' field)")
    if doc["schema"] != SCHEMA:
        raise TableError(
            f"{path}: tuning table schema {doc['schema']!r}; this mlx_w8a8 reads schema {SCHEMA}"
        )
    sections = doc.get("sections")
    if not isinstance(sections, list):
        raise TableError(f"{path}: 'sections' must be a list")
    for i, section in enumerate(sections):
        if not isinstance(section, dict) or any(f not in section for f in SECTION_FIELDS):
            raise TableError(f"{path}: section {i} lacks one of {list(SECTION_FIELDS)}")
        if not isinstance(section["device"], dict) or not isinstance(section["entries"], list):
            raise TableError(f"{path}: section {i} has a malformed 'device' or 'entries'")
        for f in ("backend", "mlx_version", "package_version"):
            if not isinstance(section[f], str):
                raise TableError(f"{path}: section {i} has {f} {section[f]!r}, not a string")
    return doc


def read(path: str) -> dict | None:
    """Read and validate the table at ``path``; ``None`` if the file does not exist.

    Raises:
        TableError: if it exists but cannot be read or is not a valid table.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise TableError(f"{path}: cannot read ({error})") from error
    try:
        doc = json.loads(text)
    except ValueError as error:
        raise TableError(f"{path}: not valid JSON ({error})") from error
    return validate(doc, path)


def load(path: str, missing_ok: bool = True) -> dict | None:
    """Like :func:`read`, but a bad table is reported once and gives ``None``, and
    invalid entries (:func:`entry_problems`) are left out of the returned table and
    reported once per file (one ``TuningTableWarning`` naming the first, at its line).

    Args:
        path: the table file.
        missing_ok: ``False`` for a table the user named to be read
            (``MLX_W8A8_TUNING_TABLE``, ``set_tuning_table``): a missing file is then
            reported once too (a typo would otherwise silently run the fallback).
    """
    try:
        doc = read(path)
        if doc is None and not missing_ok:
            report_once(
                path, "missing",
                f"[mlx_w8a8.tuning] tuning table {path} does not exist: nothing is read from "
                f"it (tuning creates it; check the path in {ENV_TABLE} or set_tuning_table)",
            )
        if doc is not None:
            doc = _without_invalid(doc, path)
        return doc
    except TableError as error:
        report_once(
            path, "corrupt",
            f"[mlx_w8a8.tuning] skipping tuning table {error}; it is left untouched "
            f"(the reference kernels run where it would have decided)",
        )
        return None


def _without_invalid(doc: dict, path: str) -> dict:
    """``doc`` without its invalid entries, which are reported once per ``path``."""
    bad = invalid_entries(doc)
    if not bad:
        return doc
    i, j, problems = bad[0]
    line = entry_line(path, doc["sections"][i]["entries"][j])
    more = f" ({len(bad) - 1} more invalid entr{'y' if len(bad) == 2 else 'ies'})" if len(bad) > 1 else ""
    report_once(
        path, "invalid",
        f"[mlx_w8a8.tuning] tuning table {path}: {describe_entry(doc['sections'][i]['entries'][j], i, j)} "
        f"is invalid: {'; '.join(problems)}{more}. Invalid entries are skipped (`python -m "
        f"mlx_w8a8.tune --show {path}` lists them)",
        line,
    )
    drop = {(i, j) for i, j, _ in bad}
    sections = [dict(section, entries=[e for j, e in enumerate(section["entries"])
                                       if (i, j) not in drop])
                for i, section in enumerate(doc["sections"])]
    return {**doc, "sections": sections}


def matching_entries(
    doc: dict, key: dict, path: str = "<table>", report_other_devices: bool = True
) -> list[dict]:
    """The valid entries of ``doc`` measured under ``key`` (this machine and versions).

    When the table holds sections but none for ``key``, reports once why (another
    device, or another MLX/package version): those entries are kept but unused.
    ``report_other_devices=False`` stays quiet about tables of other devices (the
    shipped tables: a package carries tables for devices it is not running on).
    """
    want = section_key(key)
    found: list[dict] = []
    others = []
    for section in doc["sections"]:
        if section_key(section) == want:
            found.extend(e for e in section["entries"] if not entry_problems(e))
        elif section["entries"]:
            others.append(section)
    if not found and others:
        same_device = [
            s for s in others
            if s["backend"] == key["backend"] and s["device"] == key["device"]
        ]
        if same_device:
            s = same_device[0]
            report_once(
                path, "version",
                f"[mlx_w8a8.tuning] tuning table {path} was measured with MLX {s['mlx_version']} "
                f"/ mlx_w8a8 {s['package_version']}; this is MLX {key['mlx_version']} / "
                f"mlx_w8a8 {key['package_version']}: its entries are kept but unused "
                f"(re-run `python -m mlx_w8a8.tune`)",
            )
        elif report_other_devices:
            s = others[0]
            report_once(
                path, "device",
                f"[mlx_w8a8.tuning] tuning table {path} was measured on {s['backend']} "
                f"{s['device'].get('device_name', s['device'])}; this is {key['backend']} "
                f"{key['device'].get('device_name', key['device'])}: its entries are kept but "
                f"unused (tune on this machine with `python -m mlx_w8a8.tune`)",
            )
    return found


# --- writing ----------------------------------------------------------------------------


def merge(doc: dict, key: dict, entries: Iterable[dict]) -> dict:
    """``doc`` with ``entries`` put into the section of ``key`` (same keys replaced).

    Entries of other sections and other keys are left as they are (invalid ones too).
    """
    want = section_key(key)
    sections = list(doc["sections"])
    for i, section in enumerate(sections):
        if section_key(section) == want:
            target = dict(section)
            sections[i] = target
            break
    else:
        target = dict(key, entries=[])
        sections.append(target)
    # Invalid entries have no key to merge on: they stay, after the valid ones, for
    # their owner to fix (a table is never rewritten blindly).
    invalid = [e for e in target["entries"] if entry_problems(e)]
    by_key = {entry_key(e): e for e in target["entries"] if not entry_problems(e)}
    for e in entries:
        by_key[entry_key(e)] = e
    target["entries"] = [by_key[k] for k in sorted(by_key, key=_sortable)] + invalid
    return {**doc, "schema": SCHEMA, "sections": sections}


def _sortable(key: tuple) -> tuple:
    return tuple((0, v) if isinstance(v, (int, float)) else (1, str(v)) for v in key)


def lock_for(path: str):
    """The lock (a ``filelock.FileLock`` in the user cache directory) that guards
    read-modify-write of ``path``.

    Raises:
        TableError: if ``filelock`` is not installed (tables are then read-only) or no
            lock folder can be written.
    """
    if locks.filelock is None:
        raise TableError(f"{path}: cannot write safely, the 'filelock' package is not installed")
    try:
        return locks.table_lock(path)
    except OSError as error:
        raise TableError(f"{path}: cannot lock ({error})") from error


def _lock_errors() -> tuple:
    return (OSError,) if locks.filelock is None else (OSError, locks.filelock.Timeout)


def write_entries(path: str, key: dict, entries: Iterable[dict]) -> dict:
    """Merge ``entries`` into the table at ``path`` under ``key``, atomically.

    Takes the table's file lock, re-reads the file (so entries written meanwhile by
    another process are kept), merges and replaces the file with ``os.replace``.

    Returns:
        The table as written.

    Raises:
        TableError: if the existing file is not a valid table (it is not overwritten)
            or the directory cannot be written.
    """
    entries = list(entries)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        with lock_for(path):
            return _merge_and_replace(path, lambda current: merge(current, key, entries))
    except _lock_errors() as error:
        raise TableError(f"{path}: cannot write ({error})") from error


# How many times a write re-reads a table that another writer replaced between this
# writer's read and its replace (see _merge_and_replace).
WRITE_ATTEMPTS = 5


def _file_id(path: str) -> tuple | None:
    """What tells one version of the file at ``path`` from the next (``None``: none)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _merge_and_replace(path: str, change) -> dict:
    """Read the table at ``path``, apply ``change(doc) -> doc`` and replace the file
    atomically (a temporary file in the same folder, flushed, then ``os.replace``; an
    existing file keeps its permission bits, a new one gets what the umask gives).

    The table lock lives in the writer's cache directory, so writers with different
    cache directories do not exclude each other. A writer that finds the file replaced
    since it read it (another writer's ``os.replace``) reads and merges again rather
    than replacing it with a version that lacks the other writer's entries. The check
    comes after the temporary file is written and flushed, right before the
    ``os.replace``: the window left is microseconds, against the whole
    read-merge-write-flush otherwise. Callers that must know check the file afterwards
    (:func:`account`)."""
    for attempt in range(WRITE_ATTEMPTS):
        before = _file_id(path)
        current = read(path)
        doc = change(current if current is not None else empty())
        text = json.dumps(doc, indent=1, sort_keys=False, allow_nan=False) + "\n"
        last = attempt == WRITE_ATTEMPTS - 1
        # Still the version read (or the last attempt: the last merge, as before).
        if cachedir.write_text_atomic(path, text,
                                      lambda b=before, end=last: end or _file_id(path) == b):
            return doc
    raise AssertionError("unreachable")


def account(path: str, key: dict, entries: Iterable[dict]) -> dict[str, list[dict]]:
    """Where ``entries`` (written under ``key``) stand in the table at ``path`` now:
    ``"saved"`` (the table holds them), ``"superseded"`` (it holds another measurement
    of the same key: another tuner measured it too and wrote after this one, which
    tuners with different cache directories do, not sharing claims) and ``"lost"`` (it
    holds none: the write failed, or another writer replaced the file without them)."""
    try:
        doc = read(path)
    except TableError:
        doc = None
    stored = {}
    if doc is not None:
        stored = {entry_key(e): e for e in matching_entries(doc, key, path, False)}
    out: dict[str, list[dict]] = {"saved": [], "superseded": [], "lost": []}
    for e in entries:
        there = stored.get(entry_key(e))
        out["lost" if there is None else "saved" if there == e else "superseded"].append(e)
    return out


def check_writable(path: str) -> None:
    """Raise now what :func:`write_entries` would raise after the measuring: the table at
    ``path`` is not a valid table, or its folder cannot be made or written (a temporary
    file is created there and removed).

    Raises:
        TableError: naming the path and the reason.
    """
    read(path)  # TableError on a file that is not a table
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".w8a8-", suffix=".tmp", dir=folder)
        os.close(fd)
        os.remove(tmp)
    except OSError as error:
        raise TableError(f"{path}: cannot write ({error})") from error


def write_doc(path: str, doc: dict) -> None:
    """Merge every section of ``doc`` into the table at ``path`` (see write_entries)."""
    validate(doc, "<export>")
    folder = os.path.dirname(os.path.abspath(path))

    def change(current: dict) -> dict:
        for section in doc["sections"]:
            key = {f: section[f] for f in SECTION_FIELDS if f != "entries"}
            current = merge(current, key, section["entries"])
        return current

    try:
        os.makedirs(folder, exist_ok=True)
        with lock_for(path):
            _merge_and_replace(path, change)
    except _lock_errors() as error:
        raise TableError(f"{path}: cannot write ({error})") from error

