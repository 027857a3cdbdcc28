"""``python -m mlx_w8a8.tune``: measure kernels on this machine and record a table.

Examples::

    python -m mlx_w8a8.tune --shapes mlp                 # decode (M = 1) of the presets
    python -m mlx_w8a8.tune --shapes mlp,attn --m 1,16,128,512 --table app/tuning.json
    python -m mlx_w8a8.tune --shapes 1x4096x4096 8x4096x14336
    python -m mlx_w8a8.tune --table app/tuning.json --export dist/tuning.json
    python -m mlx_w8a8.tune --show dist/tuning.json

Presets (:mod:`mlx_w8a8.tuning.shapes`): ``mlp`` and ``attn`` are the MLP and
attention projections of Llama-3-8B, Mistral-7B and Qwen2.5-7B; ``all`` is both.
Shapes already measured in the target table (same device, versions and kernels) are
skipped; ``--force`` measures them again.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time

from .kernels import registry
from .kernels.registry import Problem
from .tuning import shapes, table
from .tuning.tuner import MIN_IMPROVEMENT_BPS, TuneConfig, Tuner
from .tuning import gate, timing

DTYPES = ("bfloat16", "float16", "float32")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mlx_w8a8.tune",
        description="Gate and time every W8A8 linear kernel per (M, N, K) on this "
        "machine and record the fastest acceptable one in a tuning table.",
    )
    p.add_argument("--shapes", nargs="+", metavar="SPEC",
                   help="presets (mlp, attn, all: Llama-3-8B, Mistral-7B, Qwen2.5-7B "
                   "projections) and/or MxNxK (M tokens, N out, K in) shapes")
    p.add_argument("--m", default=",".join(map(str, shapes.DEFAULT_M)),
                   help="token counts M for presets, comma-separated (default: %(default)s)")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="activation dtype")
    p.add_argument("--format", dest="weight_format", default="per_channel",
                   choices=("per_channel", "grouped"), help="weight format")
    p.add_argument("--group-size", type=int, default=64, choices=(32, 64, 128))
    p.add_argument("--bias", action="store_true", help="measure with a bias vector")
    p.add_argument("--table", help="table to read and write (default: the user cache table)")
    p.add_argument("--export", metavar="PATH",
                   help="write this machine's entries of the table to PATH (for shipping)")
    p.add_argument("--show", metavar="PATH", help="print the table at PATH and exit")
    p.add_argument("--atol", type=float, default=gate.ATOL, help="gate absolute tolerance")
    p.add_argument("--rtol", type=float, default=gate.RTOL, help="gate relative tolerance")
    p.add_argument("--gate-reference-dtype", default="float32",
                   choices=("native", "float32"),
                   help="run the gate's reference in the problem's dtype (native) or on "
                   "float32-upcast activations (default: %(default)s)")
    p.add_argument("--min-improvement", type=float, default=MIN_IMPROVEMENT_BPS,
                   metavar="BPS", help="basis points a challenger must beat the reference by")
    p.add_argument("--pairs", type=int, default=timing.PAIRS,
                   help="alternating timing rounds (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=timing.WARMUP)
    p.add_argument("--force", action="store_true", help="re-measure shapes already in the table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("-v", "--verbose", action="store_true", help="log gate rejections")
    return p


def fmt_ns(ns) -> str:
    """``ns`` as a short human duration (``-`` for none)."""
    if ns is None or not math.isfinite(ns):
        return "-"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def render(rows: list[tuple[str, dict]], out=None) -> str:
    """A readable table of ``(note, entry)`` rows: shape, medians, choice, speedup, gate."""
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
            else:
                cells.append(fmt_ns(c.get("median_ns")))
        # the largest |c - r| any challenger showed (rejected ones included)
        errs = [c.get("gate_error") for c in cands.values() if isinstance(c, dict)]
        errs = [x for x in errs if x is not None]
        err = max(errs) if errs else (e.get("gate") or {}).get("worst_error")
        body.append(
            [str(e.get("m", e["m_bucket"])), str(e["n"]), str(e["k"]), e["dtype"], e["weight_format"]]
            + cells
            + [e["choice"], f"{e.get('speedup', 1.0):.2f}x", "-" if err is None else f"{err:.3g}", note]
        )
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def show(path: str, out) -> int:
    """Print every section of the table at ``path``; 1 if it cannot be read."""
    try:
        doc = table.read(path)
    except table.TableError as error:
        print(f"mlx_w8a8.tune: {error}", file=sys.stderr)
        return 1
    if doc is None:
        print(f"mlx_w8a8.tune: no table at {path}", file=sys.stderr)
        return 1
    here = table.section_key(table.device_key())
    print(f"{path}: schema {doc['schema']}, {len(doc['sections'])} section(s)", file=out)
    for s in doc["sections"]:
        mark = "this machine" if table.section_key(s) == here else "not this machine/versions: unused here"
        dev = s["device"].get("device_name", s["device"])
        print(f"\n[{s['backend']} {dev}, MLX {s['mlx_version']}, mlx_w8a8 {s['package_version']}] "
              f"({mark}), {len(s['entries'])} entries", file=out)
        by_op: dict[str, list] = {}
        for e in s["entries"]:
            by_op.setdefault(e["op"], []).append(e)
        for op, entries in by_op.items():
            print(f"op {op}:", file=out)
            notes = [(e.get("measured_at", ""), e) for e in entries]
            print(render(notes), file=out)
    return 0


def export(source: str, dest: str, out) -> int:
    """Write this machine's section of ``source`` into ``dest`` (merged, atomic)."""
    doc = table.load(source)
    if doc is None:
        print(f"mlx_w8a8.tune: nothing to export from {source}", file=sys.stderr)
        return 1
    key = table.device_key()
    entries = table.matching_entries(doc, key, source)
    if not entries:
        print(f"mlx_w8a8.tune: {source} has no entries for this machine", file=sys.stderr)
        return 1
    try:
        table.write_entries(dest, key, entries)
    except table.TableError as error:
        print(f"mlx_w8a8.tune: {error}", file=sys.stderr)
        return 1
    print(f"exported {len(entries)} entries for this machine to {dest}", file=out)
    return 0


def main(argv: list[str] | None = None, out=None) -> int:
    """Run the CLI; returns the exit status."""
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.ERROR,
                        format="%(message)s")
    if args.show and not args.shapes:
        return show(args.show, out)
    if not args.shapes and not args.export:
        build_parser().print_usage(sys.stderr)
        print("mlx_w8a8.tune: give --shapes, --export or --show", file=sys.stderr)
        return 2
    try:
        config = TuneConfig(atol=args.atol, rtol=args.rtol, min_improvement_bps=args.min_improvement,
                            pairs=args.pairs, warmup=args.warmup,
                            reference_dtype=None if args.gate_reference_dtype == "native"
                            else args.gate_reference_dtype)
        work = shapes.expand(args.shapes, shapes.parse_m_list(args.m)) if args.shapes else []
    except ValueError as error:
        print(f"mlx_w8a8.tune: {error}", file=sys.stderr)
        return 2
    tuner = Tuner(table_path=args.table, use_cache=args.table is None, use_shipped=False,
                  online=False, config=config)
    target = tuner.writable_path()
    group = args.group_size
    rows: list[tuple[str, dict]] = []
    failures = 0
    if work:
        print(f"tuning {len(work)} shape(s) into {target} "
              f"({table.backend()}, {tuner.key['device'].get('device_name', '?')})", file=out)
    bar = None
    if work and not args.no_progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(work) * config.pairs, unit="round", file=sys.stderr,
                       dynamic_ncols=True, leave=False)
        except Exception:
            bar = None
    started = time.perf_counter()
    for m, n, k in work:
        problem = Problem("linear", m, n, k, args.dtype, args.weight_format, group, args.bias)
        if bar is not None:
            bar.set_description(f"{m}x{n}x{k}")
        if k % group:
            print(f"  {m}x{n}x{k}: skipped, group size {group} does not divide K", file=out)
            failures += 1
            continue
        found = registry.candidates(problem)
        outcome = tuner.tune(problem, candidates=found, force=args.force,
                             progress=bar.update if bar is not None else None)
        if bar is not None and outcome.source != "measured":
            bar.update(config.pairs)
        if outcome.entry is not None:
            rows.append(("cached" if outcome.source == "table" else "measured", outcome.entry))
        else:
            failures += 1
            print(f"  {m}x{n}x{k}: {outcome.source} ({outcome.detail}); the reference stays",
                  file=out)
    if bar is not None:
        bar.close()
    if rows:
        print(render(rows), file=out)
        print(f"{len(rows)} shape(s) in {time.perf_counter() - started:.1f} s; table: {target}",
              file=out)
    status = 1 if failures and not rows else 0
    if args.export:
        status = export(target, args.export, out) or status
    if args.show:
        status = show(args.show, out) or status
    return status


if __name__ == "__main__":
    sys.exit(main())
