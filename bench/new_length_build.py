"""Host cost of building a prefill's graph at lengths never run before, and where it goes.

A server meets most prompt lengths once, so what a layer does on the first call at an
input shape (deciding its kernel, binding its launches, tracing its compiled calls) is
paid on nearly every prefill. This script builds (``model(tokens)``, Python only; each
graph is then evaluated, untimed, so the next build starts idle) prefills of the model
benchmark's variants at ``--count`` new lengths after ``T``, and at ``T`` again, after
warming every variant up at ``T`` (and at ``T + 1`` so no kernel compiles inside the
timed builds: the new lengths stay in ``T + 1``'s tile regime for ``T`` >= 129). It
prints the median build time per variant and, with ``--profile``, the mlx_w8a8
variant's ``cProfile`` over the new-length builds (own time and cumulative: MLX's calls
are C++ and count in their caller's own time), and the time Python's cyclic collector
ran within the builds (``gc.callbacks``; a profile charges it to whichever function
allocated the object that set a collection off). For a native sampling profile, each
variant's new-length builds run in a frame of their own (``_build_mlx_w8a8``,
``_build_bf16``; ``bench/spy_summary.py --within``). With ``--gc-freeze``, ``gc.freeze()``
runs after the models are built and warmed up: Python's cyclic collector then skips
every object alive at that point (the models, MLX's and mlx-lm's modules), as a server
may do after loading; a new length's build allocates closures, lists and arrays, which
trigger collections that otherwise scan all of them.

Usage: ``python bench/new_length_build.py [--model llama-3-8b] [--layers 4] [--t 129]
[--count 20] [--kernel NAME] [--table PATH] [--profile] [--gc-freeze]``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402

from mlx_w8a8 import modelbench  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_host_cost import forward  # noqa: E402


class GcClock:
    """Seconds Python's cyclic collector ran, and its collections per generation, from
    ``gc.callbacks`` (a collection's time counts in whatever function allocated the
    object that set it off: in a profile it looks like that function's own time)."""

    def __init__(self):
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._t0 = None
        gc.callbacks.append(self._tick)

    def _tick(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self.collections[info["generation"]] += 1
            self._t0 = None

    def read(self):
        return self.seconds, tuple(self.collections)


def build(model, tokens, prof=None, clock=None) -> tuple[float, float]:
    """``(build seconds, collector seconds within it)`` of one prefill's graph into a
    fresh cache (``prof`` around the build); the graph is then run."""
    before = clock.read()[0] if clock else 0.0
    seconds = forward(model, tokens, prof)[0]
    return seconds, (clock.read()[0] - before if clock else 0.0)


# The new-length builds of each variant run inside a frame of their own, so a sampling
# profiler tells them apart from each other and from the builds at T again:
#   py-spy record --native -f raw -o P.txt -- python bench/new_length_build.py ...
#   python bench/spy_summary.py P.txt --within _build_mlx_w8a8
def _build_bf16(model, tokens, prof=None, clock=None):
    return build(model, tokens, prof, clock)


def _build_mlx_w8a8(model, tokens, prof=None, clock=None):
    return build(model, tokens, prof, clock)


_NEW_LENGTH_BUILD = {"bf16": _build_bf16, "mlx_w8a8": _build_mlx_w8a8}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--t", type=int, default=129)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--kernel", default=None)
    p.add_argument("--table", default=None)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--gc-freeze", action="store_true",
                   help="gc.freeze() after the models are built and warmed up")
    a = p.parse_args(argv)
    if a.table:
        from mlx_w8a8.tuning import set_tuning_table

        set_tuning_table(a.table)
    variants, config, label = modelbench.make_variants(a.model, a.layers, 0, a.kernel)
    vocab = int(config["vocab_size"])
    longest = a.t + 2 + a.count
    pool = mx.random.randint(0, vocab, (1, longest), key=mx.random.key(3)).astype(mx.int32)
    names = ("bf16", "mlx_w8a8")
    for name in names:  # warm-up: kernels compiled, plans made at T and T + 1
        for t in (a.t, a.t, a.t + 1, a.t + 1):
            build(variants[name], pool[:, :t])
    if a.gc_freeze:
        gc.collect()
        gc.freeze()
    prof = cProfile.Profile() if a.profile else None
    clock = GcClock()
    start = clock.read()
    new = {n: [] for n in names}
    again = {n: [] for n in names}
    for i in range(a.count):
        length = a.t + 2 + i
        for name in names:
            new[name].append(_NEW_LENGTH_BUILD[name](
                variants[name], pool[:, :length], prof if name == "mlx_w8a8" else None, clock))
            again[name].append(build(variants[name], pool[:, :a.t], None, clock))
    end = clock.read()
    print(f"{label}, {a.layers} layers, kernel {a.kernel or 'table'}; MLX {mx.__version__}; "
          f"build ms, median of {a.count}; gc.freeze() {'on' if a.gc_freeze else 'off'} "
          f"({len(gc.get_objects())} objects tracked by the collector)")
    for name in names:
        print(f"{name:10s} new lengths {_ms(new[name], 0)}   T={a.t} again {_ms(again[name], 0)}")
    for name in names:
        print(f"{name:10s} collector ms in builds: new lengths median {_ms(new[name], 1)} "
              f"sum {sum(b[1] for b in new[name]) * 1e3:8.1f}; "
              f"T={a.t} again sum {sum(b[1] for b in again[name]) * 1e3:8.1f}")
    print(f"collections (gen 0, 1, 2) over the timed builds: "
          f"{tuple(e - s for s, e in zip(start[1], end[1]))}, "
          f"{(end[0] - start[0]) * 1e3:.1f} ms in all")
    if prof:
        for key in ("tottime", "cumulative"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(30)
            print(s.getvalue())
    return 0


def _ms(builds, field: int) -> str:
    return f"{statistics.median(b[field] for b in builds) * 1e3:8.3f}"


if __name__ == "__main__":
    raise SystemExit(main())
