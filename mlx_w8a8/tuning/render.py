"""Text output of the command lines: durations, sizes, ratios, aligned tables, error lines.

One renderer for ``python -m mlx_w8a8.tune`` and ``python -m mlx_w8a8.bench`` (the
tuning-table view, the qualification summary and the model benchmark's table).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from . import table


def fmt_ns(ns) -> str:
    """``ns`` nanoseconds as a short human duration (``-`` for none or non-finite)."""
    if ns is None or not math.isfinite(ns):
        return "-"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def fmt_bytes(n: int) -> str:
    """``n`` bytes in binary units (``"1.9 GiB"``; three significant digits, whole
    numbers from 100 on: ``"1000 KiB"``, not ``"1e+03 KiB"``)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"
    return f"{n} B"


def spread(ratios: Sequence[float]) -> tuple[float, float, float] | None:
    """``(median, p25, p75)`` of ``ratios`` (finite values only), or ``None``."""
    r = np.array([x for x in ratios if x is not None and math.isfinite(x)], dtype=np.float64)
    if not r.size:
        return None
    return float(np.median(r)), float(np.percentile(r, 25)), float(np.percentile(r, 75))


def fmt_ratio(ratios: Sequence[float], digits: int = 2) -> str:
    """``"1.23x (1.20..1.25)"``: median and p25..p75 of ``ratios`` (``-`` if none)."""
    s = spread(ratios)
    if s is None:
        return "-"
    med, lo, hi = s
    return f"{med:.{digits}f}x ({lo:.{digits}f}..{hi:.{digits}f})"


def columns(head: Sequence[str], body: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """An aligned text table: a header, a rule, the rows.

    Args:
        head: column titles.
        body: rows of cell strings (as many cells as titles).
        right: indices of right-aligned columns (numbers); others are left-aligned.
    """
    rows = [list(map(str, head))] + [list(map(str, r)) for r in body]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]

    def line(cells):
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    return "\n".join([line(rows[0]), line(["-" * w for w in widths])] + [line(r) for r in rows[1:]])


def entries(rows: list[tuple[str, dict]]) -> str:
    """Tuning-table entries as a table: shape, candidate medians, choice, speedup, gate.

    Args:
        rows: ``(note, entry)`` pairs; ``entry`` is a table entry (see
            :mod:`mlx_w8a8.tuning.table`), ``note`` a free text column.
    """
    names: list[str] = []
    for _, e in rows:
        for n in e.get("candidates", {}):
            if n not in names:
                names.append(n)
    head = ["M", "N", "K", "dtype", "format"] + names + ["choice", "speedup", "gate err", "note"]
    body = []
    for note, e in rows:
        cands = e.get("candidates", {})
        cells = []
        for n in names:
            c = cands.get(n)
            if c is None:
                cells.append("")
            elif c.get("status") != "ok":
                cells.append(c.get("status", "?"))
            elif c.get("rounds") == 1:  # pruned by the tuner: one round, far slower
                cells.append(f"{fmt_ns(c.get('median_ns'))} (1 round)")
            else:
                cells.append(fmt_ns(c.get("median_ns")))
        # the largest |c - r| any challenger showed (rejected ones included)
        errs = [c.get("gate_error") for c in cands.values() if isinstance(c, dict)]
        errs = [x for x in errs if x is not None]
        err = max(errs) if errs else (e.get("gate") or {}).get("worst_error")
        check = e.get("decode_check")
        if isinstance(check, dict) and "tuned" in check:
            verdict = "kept" if check.get("kept") else "replaced"
            # batch: the batched decode of B sequences judged this M = B entry
            where = f" (batched, B = {check['batch']})" if check.get("batch") else ""
            note = (f"{note}; " if note else "") + (
                f"decode check{where}: {check['tuned']} {verdict} ({check.get('ratio', 0):.2f}x)")
        check = e.get("sibling_check")
        if isinstance(check, dict) and "tuned" in check:
            verdict = "kept" if check.get("kept") else "members alone"
            note = (f"{note}; " if note else "") + (
                f"sibling check: {check['tuned']} {verdict} ({check.get('ratio', 0):.2f}x)")
        close = table.pruned_within_reach(e)
        if close:
            note = (f"{note}; " if note else "") + (
                f"{', '.join(close)} pruned within reach: tune measures it again")
        kept = e.get("previous_choice")
        times = {n: c.get("median_ns") for n, c in (e.get("candidates") or {}).items()
                 if isinstance(c, dict) and c.get("median_ns") is not None}
        fastest = min(times, key=times.get) if times else None
        if kept is not None and kept == e["choice"] and fastest not in (None, kept):
            note = (f"{note}; " if note else "") + (
                f"kept on record: {fastest} faster within the margin")
        if e.get("borrowed_from"):
            b = e["borrowed_from"]
            note = (f"{note}; " if note else "") + f"decision of {b.get('n')}x{b.get('k')}"
        body.append(
            [str(e.get("m", e["m_bucket"])), str(e["n"]), str(e["k"]), e["dtype"], e["weight_format"]]
            + cells
            + [e["choice"], f"{e.get('speedup', 1.0):.2f}x", "-" if err is None else f"{err:.3g}", note]
        )
    return columns(head, body)


def error_line(prog: str, message: str) -> str:
    """``message`` for stderr, prefixed once: ``[prog] ...`` unless it already starts
    with a ``[...]`` op prefix of its own."""
    text = str(message).strip()
    return text if text.startswith("[") else f"[{prog}] {text}"
