"""Where a sampled profile's time goes: a ``py-spy record --native -f raw`` profile
(collapsed stacks, one ``frame;frame;...;frame COUNT`` line per distinct stack) read as
shares of the samples.

Only the samples whose stack holds a frame containing ``--within`` count, and their
frames from that one on; given more than once, each is looked for below the one before
(``--within _build_mlx_w8a8 --within Model.__call__``: the model's call inside the W8A8
variant's new-length builds of ``bench/new_length_build.py``, without the evaluation
that follows each build). Printed: the number of those samples, then per frame
the share of them whose stack holds it (inclusive: a frame on a stack twice counts
once), then per frame the share where it is the innermost (self time). Native frames
keep their function and library, not their address (``0x7f.. (libc.so.6)`` reads
``(libc.so.6)``). A Python frame is named with the line it was at, so one function can
show under several names; ``--by-function`` drops the lines.

Usage: ``python bench/spy_summary.py PROFILE.txt [--within TEXT ...] [--top 40]
[--by-function]``.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

_ADDRESS = re.compile(r"^0x[0-9a-f]+ ")
_LINE = re.compile(r":\d+\)$")


def read(path: str, by_function: bool = False) -> list[tuple[list[str], int]]:
    """``[(frames outermost first, samples)]`` of a raw py-spy profile (``by_function``:
    Python frames without their line, ``f (m.py:12)`` as ``f (m.py)``).

    Raises:
        ValueError: for a line that is not ``frames COUNT``.
    """
    stacks = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            frames, _, count = line.rpartition(" ")
            if not frames or not count.isdigit():
                raise ValueError(f"[spy_summary] {path}:{number} is not 'frame;...;frame COUNT': "
                                 f"{line[:80]!r}")
            names = [_ADDRESS.sub("", f) for f in frames.split(";")]
            if by_function:
                names = [_LINE.sub(")", f) for f in names]
            stacks.append((names, int(count)))
    return stacks


def summarize(stacks, within: tuple[str, ...] = ()):
    """``(samples, inclusive Counter, self Counter)`` over the stacks holding a frame
    that contains ``within[0]``, below it one containing ``within[1]``, and so on (all
    stacks where ``within`` is empty), from the last of those frames on."""
    total, inclusive, own = 0, collections.Counter(), collections.Counter()
    for frames, count in stacks:
        for text in within:
            at = next((i for i, f in enumerate(frames) if text in f), None)
            if at is None:
                break
            frames = frames[at:]
        else:
            total += count
            for frame in set(frames):
                inclusive[frame] += count
            own[frames[-1]] += count
    return total, inclusive, own


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile")
    p.add_argument("--within", action="append", default=[],
                   help="count only stacks holding this frame text (repeat: nested)")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--by-function", action="store_true", help="Python frames without their line")
    a = p.parse_args(argv)
    total, inclusive, own = summarize(read(a.profile, a.by_function), tuple(a.within))
    where = "".join(f" within {w!r}" for w in a.within)
    if not total:
        print(f"no samples{where}")
        return 1
    print(f"{total} samples{where}")
    for title, counter in (("inclusive", inclusive), ("self", own)):
        print(f"== {title}, top {a.top}")
        for frame, count in counter.most_common(a.top):
            print(f"{100 * count / total:6.1f}%  {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
