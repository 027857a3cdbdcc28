"""Batched decode at B rows per linear: does the decode check see what the model sees?

On a model of a preset's dimensions (random weights, bf16, per-channel W8A8 layers),
for each batch size B: the per-shape race at M = B for every shape the decode step runs
(its sibling sums included) into a fresh table (M = 1 entries pinned to
``mx.quantized_matmul``, so the check's B = 1 pass has nothing to judge); then the
model's batched decode (``tuning.model_timing.batch_decode``, mlx-lm's BatchGenerator)
in alternating rounds with

- ``qmm``: every linear forced onto ``mx.quantized_matmul``,
- ``tuned``: every linear on the table's choice at M = B,
- ``down``: the down projections on theirs, every other linear on ``mx.quantized_matmul``;
- ``tuned-down``: every linear on the table's choice but the down projections, on
  ``mx.quantized_matmul`` (the decode check's variant for them);
- ``apart``: sibling layers (q/k/v, gate/up) each launched alone on its own decision,
  every other linear on ``mx.quantized_matmul`` (what the check once judged every group
  against: each added to this arrangement);
- ``apart+down``: the same with the down projections on their choice;
- ``qmm-nogc``, ``tuned-nogc``: ``qmm`` and ``tuned`` with Python's cyclic garbage
  collector disabled while the decode runs;

and last the decode check itself (``tuning.check_decode``, nothing recorded) on the same
model and table at the same B. Per-step milliseconds are medians over the rounds; a
gain is the median of the paired per-round ratios. For each arm the probe also prints the
time the cyclic collector took per round (``gc.callbacks``) and its full collections.

    python bench/batched_decode_probe.py --model llama-3-8b --layers 4 --batch 4,16
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

import mlx.core as mx

from mlx_w8a8 import models, quantize, siblings, tuning
from mlx_w8a8.kernels import registry
from mlx_w8a8.tuning import linears, model_timing
from mlx_w8a8.tuning.tuner import Tuner

QMM = "mlx_qmm"


ARMS = ("qmm", "tuned", "down", "tuned-down", "apart", "apart+down", "qmm-nogc", "tuned-nogc")
NOGC = "-nogc"


class CollectorClock:
    """A ``gc.callbacks`` entry: seconds spent in the cyclic collector and the number of
    full (generation 2) collections since :meth:`reset`."""

    def __init__(self):
        self.reset()
        self._start = None

    def reset(self) -> None:
        self.seconds, self.full = 0.0, 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self.full += info["generation"] == 2
            self._start = None


def arrange(layers, arm: str) -> None:
    arm = arm.removesuffix(NOGC)
    siblings.launch_together(not arm.startswith("apart"))
    for path, layer in layers:
        down = path.endswith("down_proj")
        if arm == "tuned" or (down and arm in ("down", "apart+down")):
            want = None
        elif arm == "tuned-down":
            want = QMM if down else None
        elif arm.startswith("apart") and layer.siblings is not None:
            want = None  # alone, on its own decision
        else:
            want = QMM
        if layer.kernel != want:
            layer.kernel = want


def host_us_per_op(count: int = 20000) -> float:
    """Microseconds the host takes to build one small MLX op (``mx.add`` on two scalars,
    not evaluated): the host's speed at what a decode step's Python does most, printed so
    that runs on different machines can be told apart."""
    a, b = mx.array(1.0), mx.array(2.0)
    start = time.perf_counter()
    for _ in range(count):
        mx.add(a, b)
    return (time.perf_counter() - start) / count * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", default="4,16", help="batch sizes B, comma-separated")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batch.split(",")]

    model, _, label = models.build(args.model, layers=args.layers, dtype=mx.bfloat16)
    quantize(model, per_channel=True)
    mx.eval(model.parameters())
    layers = linears.w8a8_linears(model)
    path = os.path.join(tempfile.mkdtemp(), "probe.json")
    tuner = Tuner(table_path=path, use_cache=False, use_shipped=False)
    tuning.use_tuner(tuner)
    print(f"{label}: {args.layers} layer(s), {len(layers)} linears; device "
          f"{mx.default_device()}; table {os.path.basename(path)} (fresh); host "
          f"{host_us_per_op():.2f} us per op built", flush=True)
    # the tune command's problems: every distinct shape, sibling sums included
    shape_list = linears.model_shapes(model)[0]
    qmm = registry.get("linear", QMM)
    for problem in linears.problems(shape_list, [1]):
        entry = tuner.measure(problem, candidates=[qmm])
        tuner.record(tuner.claim(problem), entry)
    vocab = model_timing.vocab_size(model, "batched_decode_probe")
    for b in batches:
        t0 = time.perf_counter()
        for problem in linears.problems(shape_list, [b]):
            out = tuner.tune(problem)
            times = {n: c.get("median_ns") for n, c in out.entry["candidates"].items()}
            print(f"B = {b}: {problem.n}x{problem.k} -> {out.choice} "
                  f"(mlx_qmm {times.get(QMM, 0) / 1e3:.1f} us, "
                  f"choice {times.get(out.choice, 0) / 1e3:.1f} us)", flush=True)
        print(f"B = {b}: race at M = {b} in {time.perf_counter() - t0:.0f} s", flush=True)
        prompts = model_timing.prompt_tokens(vocab, args.prompt, rows=b)  # the check's
        arms = list(ARMS)
        clock = CollectorClock()
        collector = {a: [] for a in arms}  # (seconds, full collections) per round

        def measure(arm: str) -> float:
            arrange(layers, arm)
            clock.reset()
            if arm.endswith(NOGC):
                gc.disable()
            try:
                step = model_timing.batch_decode(model, prompts, args.steps) / args.steps
            finally:
                gc.enable()
            collector[arm].append((clock.seconds, clock.full))
            return step

        gc.callbacks.append(clock)
        try:
            for arm in arms:  # untimed: plans built, kernels compiled
                measure(arm)
            seconds = model_timing.alternate(arms, args.rounds, measure)
        finally:
            gc.callbacks.remove(clock)

        def gain(slow: str, fast: str) -> float:
            return statistics.median(s / f for s, f in zip(seconds[slow], seconds[fast]))

        med = {a: statistics.median(seconds[a]) for a in arms}
        print(f"B = {b}: per step (median of {args.rounds} rounds): "
              + ", ".join(f"{a} {med[a] * 1e3:.2f} ms ({gain('qmm', a):.2f}x qmm; rounds "
                          f"{min(seconds[a]) * 1e3:.2f}..{max(seconds[a]) * 1e3:.2f})"
                          for a in arms), flush=True)
        print(f"B = {b}: rounds in order (ms per step): " + "; ".join(
            f"{a} " + " ".join(f"{t * 1e3:.1f}" for t in seconds[a]) for a in arms), flush=True)
        timed = {a: collector[a][1:] for a in arms}  # the untimed call's left out
        print(f"B = {b}: cyclic collector per round (median ms; full collections in all "
              f"rounds): " + ", ".join(
                  f"{a} {statistics.median(t for t, _ in timed[a]) * 1e3:.1f} "
                  f"({sum(f for _, f in timed[a])})" for a in arms), flush=True)
        print(f"B = {b}: the down projections' gain: added to qmm {gain('qmm', 'down'):.2f}x, "
              f"taken off tuned {gain('tuned-down', 'tuned'):.2f}x, added to apart "
              f"{gain('apart', 'apart+down'):.2f}x", flush=True)
        arrange(layers, "tuned")  # nothing forced, siblings together: the check arranges its own
        t0 = time.perf_counter()
        result = tuning.check_decode(model, tuner, batches=(b,), rounds=args.rounds,
                                     extra_rounds=0, record=False, steps=args.steps,
                                     prompt=args.prompt)
        print(result.describe(), flush=True)
        print(f"B = {b}: decode check in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
