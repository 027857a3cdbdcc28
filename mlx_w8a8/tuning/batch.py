"""Tune a list of problems in one go: a progress bar with the time left, and an
account of what reached the table (also after Ctrl-C).

Used by ``python -m mlx_w8a8.tune`` and :func:`mlx_w8a8.tuning.tune_model`.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Sequence

from ..kernels import registry
from ..kernels.registry import Problem
from . import table
from .tuner import Outcome, Tuner


def cost(problem: Problem, backend: str) -> float:
    """Relative time of one timing round of ``problem``, for the time-left estimate:
    weight bytes (N x K) times the tokens beyond which the work stops being bound by
    reading the weight (about 1 on a CPU, 64 on a GPU)."""
    knee = 1 if backend == "cpu" else 64
    return float(problem.n) * problem.k * max(problem.m, knee)


def _terminal(stream) -> bool:
    """Whether ``stream`` is a terminal (``False`` for one without ``isatty`` or closed)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class LineProgress:
    """The progress of a batch as one plain line per problem started, for a stderr that
    is not a terminal (a log file, a CI job): a redrawn bar would write a
    carriage-return line per update there. The subset of a tqdm bar's interface that
    :class:`Batch` uses."""

    def __init__(self, total: float, file=None):
        self.total, self.n, self.file = total, 0.0, file or sys.stderr
        self.start = time.perf_counter()

    def update(self, amount: float) -> None:
        self.n += amount

    def set_description_str(self, text: str) -> None:
        elapsed = int(time.perf_counter() - self.start)
        print(f"tune: {text} ({100 * min(self.n / self.total, 1.0):.0f}% of the estimated "
              f"work done, {elapsed // 60}:{elapsed % 60:02d} elapsed)", file=self.file,
              flush=True)

    def close(self) -> None:
        pass


class Batch:
    """Measure ``problems`` with ``tuner``, one after the other.

    Problems already measured in the writable table are skipped (unless ``force``);
    each measured entry is recorded by the tuner as soon as it is done, so an
    interrupted batch keeps what it finished.

    Args:
        tuner: the :class:`Tuner` (its writable table receives the entries).
        problems: the work, in order.
        force: measure again what the table already has.
        progress: show the progress on stderr: a tqdm bar with the estimated time left
            on a terminal, else a line per problem (:class:`LineProgress`).
        describe: ``describe(problem) -> str``, the bar's label of a problem.
    """

    def __init__(
        self,
        tuner: Tuner,
        problems: Sequence[Problem],
        force: bool = False,
        progress: bool = True,
        describe: Callable[[Problem], str] | None = None,
    ):
        self.tuner = tuner
        self.problems = list(problems)
        self.force = force
        self.progress = progress
        self.describe = describe or (lambda p: f"{p.m}x{p.n}x{p.k}")
        self.results: list[tuple[Problem, Outcome]] = []

    def pending(self) -> list[Problem]:
        """The problems that will be measured (not already in the writable table)."""
        if self.force:
            return list(self.problems)
        return [p for p in self.problems
                if self.tuner.measured(p, candidates=registry.candidates(p)) is None]

    def _bar(self, total: float):
        if not self.progress or total <= 0:
            return None
        if not _terminal(sys.stderr):
            return LineProgress(total)
        try:
            from tqdm import tqdm
        except ImportError:  # a declared dependency; without it, no bar
            return None
        return tqdm(total=total, file=sys.stderr, dynamic_ncols=True, leave=False, smoothing=0,
                    bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed} elapsed, ~{remaining} left")

    def run(self) -> list[tuple[Problem, Outcome]]:
        """Tune every problem; returns ``(problem, outcome)`` pairs (also kept in
        :attr:`results` as they finish). ``KeyboardInterrupt`` propagates after the
        bar is closed; :meth:`saved` then says what was recorded."""
        backend = self.tuner.key.get("backend", "cpu")
        pending = set(self.pending())
        rounds = self.tuner.config.pairs + 2  # the gate and warm-up cost about two rounds
        total = sum(cost(p, backend) * rounds for p in self.problems if p in pending)
        bar = self._bar(total)
        todo = sum(1 for p in self.problems if p in pending)
        done = 0
        try:
            for problem in self.problems:
                share = cost(problem, backend)
                if bar is not None and problem in pending:
                    done += 1
                    bar.set_description_str(f"{done}/{todo} {self.describe(problem)}")
                start = bar.n if bar is not None else 0
                outcome = self.tuner.tune(
                    problem, candidates=registry.candidates(problem), force=self.force,
                    progress=(lambda k, s=share: bar.update(k * s)) if bar is not None else None,
                )
                self.results.append((problem, outcome))
                if bar is not None and problem in pending:
                    bar.update(max(0.0, start + share * rounds - bar.n))
        finally:
            if bar is not None:
                bar.close()
        return self.results

    def measured(self) -> list[dict]:
        """Entries measured by this batch so far, one per table key (problems that
        share a key, e.g. with and without bias where the table does not tell them
        apart, keep the last measurement: the one the table holds)."""
        latest = {}
        for _, o in self.results:
            if o.source == "measured" and o.entry is not None:
                latest[table.entry_key(o.entry)] = o.entry
        return list(latest.values())

    def saved(self) -> int:
        """How many of :meth:`measured` are in the writable table now."""
        entries = self.measured()
        if not entries:
            return 0
        path = self.tuner.writable_path()
        try:
            doc = table.read(path)
        except table.TableError:
            return 0
        if doc is None:
            return 0
        stored = {(table.entry_key(e), e.get("measured_at"))
                  for e in table.matching_entries(doc, self.tuner.key, path, False)}
        return sum((table.entry_key(e), e.get("measured_at")) in stored for e in entries)


def tune_model(
    model,
    m: Sequence[int] | None = None,
    *,
    dtype: str = "bfloat16",
    weight_format: str = "per_channel",
    group_size: int = 64,
    tp: int = 1,
    force: bool = False,
    progress: bool = True,
    tuner: Tuner | None = None,
) -> list[tuple[Problem, Outcome]]:
    """Measure the distinct linear shapes of ``model`` at the M buckets ``m``.

    Every ``nn.Linear`` (as :func:`mlx_w8a8.quantize` would convert it), 8-bit
    ``nn.QuantizedLinear`` and ``mlx_w8a8.Linear`` layer is grouped by (N, K, weight
    format, group size, bias, dtype) and each group is tuned once per bucket, into the
    tuner's writable table (the table named by :func:`set_tuning_table`, else the user
    cache table). Shapes already measured there are skipped unless ``force``.

    Per-shape timing can favour a kernel at M = 1 that makes the model's decode slower
    (``docs/tuning.md``, the decode check): after converting the model with
    :func:`mlx_w8a8.quantize`, run :func:`mlx_w8a8.tuning.check_decode` on it, as
    ``python -m mlx_w8a8.tune --model`` does on a GPU.

    Args:
        model: the model (e.g. from ``mlx_lm.load``), before or after conversion.
        m: token counts to measure (default: 1, 2, 4, ..., 4096 on a GPU; 1 and 4 on a
            CPU, see :func:`mlx_w8a8.tuning.shapes.default_m`).
        dtype: the activation dtype the model runs in.
        weight_format: ``"per_channel"`` or ``"grouped"``, for ``nn.Linear`` layers.
        group_size: 32, 64 or 128, for ``nn.Linear`` layers.
        tp: tensor-parallel ranks (column-parallel q/k/v/gate/up at N / tp,
            row-parallel o/down at K / tp).
        force: measure again shapes the table already has.
        progress: show a progress bar with the time left.
        tuner: the tuner to use (default: the process-wide one).

    Returns:
        ``(problem, outcome)`` per measured problem (see :class:`Outcome`).

    Raises:
        ValueError: for invalid arguments, or a model without linear layers to tune.
    """
    from . import linears, shapes
    from .active import get_tuner

    m_values = shapes.default_m() if m is None else sorted({int(v) for v in m})
    if not m_values or min(m_values) < 1:
        raise ValueError(f"[mlx_w8a8.tune_model] m must be positive token counts, got {m!r}")
    found, _ = linears.model_shapes(model, dtype, weight_format, group_size, tp,
                                    sibling_sums=linears.group_launch_available())
    if not found:
        raise ValueError(
            f"[mlx_w8a8.tune_model] {type(model).__name__} has no linear layers to tune "
            f"(nn.Linear, 8-bit nn.QuantizedLinear or mlx_w8a8.Linear)"
        )
    batch = Batch(tuner or get_tuner(), linears.problems(found, m_values), force, progress)
    return batch.run()
