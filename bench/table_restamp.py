"""A tuning table with its recorded digests rewritten to this tree's candidates: the same
decisions, for an A/B comparison of a change that does not touch what was measured.

A table's entries are fresh only while every candidate they measured has the digest
recorded for it (``docs/tuning.md``); a change to candidate code (even its host-side launch
glue) stales them, and the tuner then falls back. To compare such a tree's host cost
against the tree the table was measured on, on the same decisions, this writes a copy whose
``digest`` fields are this tree's. The copy says nothing about this tree's kernel times:
ship it only where the code measured is shown to run unchanged (``bench/launch_diff.py
COMMIT``: the same launches; ``bench/sass_diff.py COMMIT``: the same machine code), and
say so in ``mlx_w8a8/tables/README.md``; otherwise re-measure with
``python -m mlx_w8a8.tune``.

Usage: ``python bench/table_restamp.py IN.json OUT.json``; prints how many digests changed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def restamp(doc: dict) -> int:
    """Rewrite ``doc``'s candidate digests in place to the registered candidates' (those
    not registered here are left as they are); the number changed."""
    from mlx_w8a8.kernels import registry

    changed = 0
    for section in doc["sections"]:
        for entry in section["entries"]:
            for name, info in (entry.get("candidates") or {}).items():
                cand = registry.find(entry["op"], name)
                if cand is not None and isinstance(info, dict) and info.get("digest") != cand.digest:
                    info["digest"] = cand.digest
                    changed += 1
    return changed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("table")
    p.add_argument("out")
    a = p.parse_args(argv)
    if os.path.abspath(a.table) == os.path.abspath(a.out):
        p.error("OUT must be another file: the measured table stays as it was")
    with open(a.table, encoding="utf-8") as f:
        doc = json.load(f)
    changed = restamp(doc)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    print(f"{changed} digest(s) rewritten into {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
