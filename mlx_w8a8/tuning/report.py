"""Check reports: the JSON ``python -m mlx_w8a8.check --report FILE`` writes on one
machine, and the tuning-table entries it turns into (``python -m mlx_w8a8.tune
--from-report FILE``).

A report (schema 1)::

    {"report_schema": 1,
     "section_key": {"backend": "metal", "device": {...}, "mlx_version": ..., "package_version": ...},
     "environment": {"macos": "26.2", "darwin": "25.2.0", "mlx": ..., "capabilities": {...}},
     "exactness": {"linear": {"metal_simd_w8a8_gemm": {"ok": true, "errors": [], ...}, ...}, ...},
     "timings": [{"m": 128, "n": 4096, "k": 4096, "dtype": "bfloat16",
                  "weight_format": "per_channel", "group_size": 64, "reference": "mlx_qmm",
                  "candidates": {"mlx_qmm": {"digest": ..., "median_ns": ..., "status": "ok"},
                                 ...}}]}

A timing row becomes an entry only for the candidates the report found exact; the
choice follows the tuner's rule (:func:`~mlx_w8a8.tuning.timing.select_fastest`: a
challenger must beat the reference by ``min_improvement_bps``). Entries carry every
candidate's digest, so the table uses them only while the kernels are the ones measured.
"""

from __future__ import annotations

import json
from typing import Any

from . import shapes, timing
from .tuner import MIN_IMPROVEMENT_BPS

REPORT_SCHEMA = 1


def _fail(path: str, what: str) -> ValueError:
    return ValueError(f"[mlx_w8a8.tuning.report] {path}: {what}")


def validate(report: Any, path: str = "<report>") -> dict:
    """Check that ``report`` is a check report this package reads.

    Raises:
        ValueError: naming the path and the missing or malformed field.
    """
    if not isinstance(report, dict) or report.get("report_schema") != REPORT_SCHEMA:
        got = report.get("report_schema") if isinstance(report, dict) else type(report).__name__
        raise _fail(path, f"not a check report of schema {REPORT_SCHEMA} (report_schema = {got!r})")
    key = report.get("section_key")
    if not isinstance(key, dict) or any(f not in key for f in ("backend", "device", "mlx_version", "package_version")):
        raise _fail(path, "'section_key' must hold backend, device, mlx_version and package_version")
    if not isinstance(report.get("exactness"), dict) or not isinstance(report.get("timings"), list):
        raise _fail(path, "'exactness' must be an object and 'timings' a list")
    for i, row in enumerate(report["timings"]):
        need = ("m", "n", "k", "dtype", "weight_format", "group_size", "reference", "candidates")
        if not isinstance(row, dict) or any(f not in row for f in need):
            raise _fail(path, f"timings[{i}] lacks one of {list(need)}")
    return report


def entries_from_report(report: dict, min_improvement_bps: float = MIN_IMPROVEMENT_BPS,
                        path: str = "<report>") -> tuple[dict, list[dict]]:
    """``(section_key, entries)`` for a tuning table from a check report.

    Args:
        report: a parsed report (:func:`validate` is applied).
        min_improvement_bps: the margin a challenger must beat the reference by.
        path: the report's name, for error messages.

    Returns:
        The report's section key and one ``linear`` entry per timing row whose
        reference has a time; candidates that were not exact, or have no time, are
        recorded with their status but never chosen.
    """
    validate(report, path)
    linear = report["exactness"].get("linear")
    exact = {name for name, row in (linear if isinstance(linear, dict) else {}).items()
             if isinstance(row, dict) and row.get("ok")}
    entries = []
    for row in report["timings"]:
        ref = row["reference"]
        medians, info = {}, {}
        for name, c in row["candidates"].items():
            ok = c.get("status") == "ok" and isinstance(c.get("median_ns"), (int, float))
            status = c.get("status", "unavailable") if name in exact or name == ref else "inexact"
            info[name] = {"backend": c.get("backend", ""), "digest": c.get("digest", ""), "status": status}
            if ok:
                info[name]["median_ns"] = c["median_ns"]
                if name in exact or name == ref:
                    medians[name] = float(c["median_ns"])
        if ref not in medians:
            continue
        choice = timing.select_fastest(medians, ref, min_improvement_bps)
        entries.append({
            "op": "linear", "m_bucket": shapes.bucket(int(row["m"])), "n": int(row["n"]), "k": int(row["k"]),
            "dtype": row["dtype"], "weight_format": row["weight_format"], "group_size": row["group_size"],
            **({"act_scales": row["act_scales"]} if row.get("act_scales", "token") != "token" else {}),
            "choice": choice, "reference": ref, "m": int(row["m"]), "has_bias": bool(row.get("has_bias", False)),
            "speedup": round(medians[ref] / medians[choice], 4), "candidates": info,
            "min_improvement_bps": min_improvement_bps, "source": "check --report",
            "measured_at": report.get("created_at", ""),
        })
    return dict(report["section_key"]), entries


def read_report(path: str) -> dict:
    """Load and validate a report file.

    Raises:
        ValueError: unreadable JSON or not a report.
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise _fail(path, f"cannot read: {type(error).__name__}: {error}") from error
    return validate(doc, path)


def table_from_report(report_path: str, table_path: str, min_improvement_bps: float = MIN_IMPROVEMENT_BPS) -> int:
    """Merge the entries of the report at ``report_path`` into the table at
    ``table_path`` (created if absent; same locking and atomic write as the tuner).
    Returns the number of entries written."""
    from . import table

    key, entries = entries_from_report(read_report(report_path), min_improvement_bps, report_path)
    if entries:
        table.write_entries(table_path, key, entries)
    return len(entries)
