"""Where a profiled kernel's warps wait, from Nsight Compute's per-instruction source page.

Reads the CSV that ``ncu -i REPORT --page source --csv --print-source sass`` writes (one
block per profiled kernel, optionally gzipped) and prints, per kernel: the warp-stall
samples by reason, the shared-memory wavefronts and executed instructions by opcode
(what keeps the shared-memory pipe busy: ``LDS`` against the wgmma operand reads,
``IGMMA``), and the instructions with the most samples with their three main reasons.

Usage: ``python bench/ncu_summary.py FILE.csv[.gz] [--top 20]``. Needs no GPU.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io

SAMPLES = "Warp Stall Sampling (All Samples)"


def kernels(text: str) -> list[tuple[str, list[dict]]]:
    """``[(kernel name, rows)]`` of a source-page CSV, a row a dict by column name."""
    out, block = [], None
    for line in text.splitlines():
        if line.startswith('"Kernel Name"'):
            block = [next(csv.reader([line]))[1], []]
            out.append(block)
        elif block is not None and line.strip():
            block[1].append(line)
    result = []
    for name, lines in out:
        reader = csv.DictReader(io.StringIO("\n".join(lines)))
        result.append((name, [r for r in reader if r.get("Address")]))
    return result


def opcode(source: str) -> str:
    """The SASS opcode of a source line, without predicate or modifiers (``LDS``)."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def number(row: dict, key: str) -> int:
    value = (row.get(key) or "0").replace(",", "")
    return int(float(value)) if value not in ("", "-") else 0


def summary(name: str, rows: list[dict], top: int) -> str:
    stalls = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    total = sum(number(r, SAMPLES) for r in rows)
    by_reason = collections.Counter({s: sum(number(r, s) for r in rows) for s in stalls})
    waves, executed = collections.Counter(), collections.Counter()
    for r in rows:
        op = opcode(r["Source"])
        waves[op] += number(r, "L1 Wavefronts Shared")
        executed[op] += number(r, "Instructions Executed")
    lines = [f"kernel {name[:110]}", f"  warp-stall samples {total}"]
    lines += [f"    {s[6:]:18s} {v:8d} {100 * v / max(1, total):5.1f}%"
              for s, v in by_reason.most_common() if v]
    all_waves = sum(waves.values())
    lines.append(f"  shared-memory wavefronts {all_waves}: " + ", ".join(
        f"{op} {v} ({100 * v / max(1, all_waves):.0f}%)" for op, v in waves.most_common(5) if v))
    lines.append("  executed instructions by opcode: " + ", ".join(
        f"{op} {v}" for op, v in executed.most_common(12)))
    lines.append(f"  the {top} instructions with the most samples (samples, reasons):")
    for r in sorted(rows, key=lambda r: -number(r, SAMPLES))[:top]:
        reasons = sorted(((number(r, s), s[6:]) for s in stalls), reverse=True)[:3]
        lines.append(f"    {number(r, SAMPLES):7d}  {r['Source'].strip()[:58]:58s} "
                     + ", ".join(f"{k} {v}" for v, k in reasons if v))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file", help="ncu --page source --csv --print-source sass output (.gz ok)")
    p.add_argument("--top", type=int, default=20, help="instructions listed per kernel")
    args = p.parse_args(argv)
    opener = gzip.open if args.file.endswith(".gz") else open
    with opener(args.file, "rt", encoding="utf-8") as f:
        text = f.read()
    found = kernels(text)
    if not found:
        raise SystemExit(f"[ncu_summary] no kernel blocks in {args.file}")
    print("\n\n".join(summary(name, rows, args.top) for name, rows in found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
