"""Check a model's sibling launches in the model's own prefill.

Sibling layers (q/k/v, gate/up: :mod:`mlx_w8a8.siblings`) run as one launch where the
kernel decided for their summed shape has a multi-weight form. That decision comes from
per-shape timing of the summed shape against ``mx.quantized_matmul``, which says nothing
about how the members alone would have run *in the model*: there they may take other
kernels, and MLX runs independent graph nodes (the three projections of x) concurrently.
Measured on an NVIDIA H200 (4 Llama-3-8B layers, paired): the group launches made
prefill 1.08x faster at T = 512 and 0.92x as fast at T = 128
(2026-11-30, ``bench --model ... --unlinked``).

So :func:`check_siblings` times the model's prefill of ``T`` tokens, for each ``T``, in
paired alternating rounds: ``together`` (the groups as decided) and ``alone`` (every
member by itself: :func:`mlx_w8a8.siblings.launch_together` off). The group launches
stay at that ``T`` only if ``together`` is faster by the tuner's margin (median of the
per-round ratios) and in at least three rounds of four (lower quartile >= 1), over the
extra rounds too where the first ones left that unsettled (median passing, quartile not:
:func:`~mlx_w8a8.tuning.decode_check.extend_unsettled`); otherwise
the summed shape's entry at that M bucket is rewritten with the reference as its choice,
so the members run alone there. Either way the entry records what the check saw
(``sibling_check``). All groups of a ``T`` are judged together (one variant each way), a
deliberate simplification.
"""

from __future__ import annotations

from typing import Callable

import attrs
import mlx.nn as nn

from .. import siblings
from ..kernels import registry
from ..kernels.registry import Problem
from .decode_check import (GroupResult, extend_unsettled, more_rounds,
                           paired_verdict, prefill_args, record_verdicts, PREFILL_ROUNDS)
from .tuner import MIN_IMPROVEMENT_BPS, Tuner

OP = "mlx_w8a8.check_siblings"
ROUNDS = PREFILL_ROUNDS


@attrs.frozen
class SiblingCheck:
    """The result of :func:`check_siblings`.

    Args:
        groups: one :class:`~mlx_w8a8.tuning.decode_check.GroupResult` per summed
            problem (sibling group shape at one ``T``) that ran as one launch; ``tuned``
            is its kernel, ``ratio`` / ``low`` the median / lower quartile over rounds of
            ``seconds(alone) / seconds(together)`` for its ``T``.
        rounds: paired rounds per ``T``.
        seconds: ``{T: {"together": [...], "alone": [...]}}``.
        recorded: entries written to the tuner's writable table.
    """

    groups: tuple[GroupResult, ...]
    rounds: int
    seconds: dict
    recorded: int

    def describe(self) -> str:
        """One line per summed problem: its shape, T, kernel, ratio and verdict."""
        if not self.groups:
            return "sibling check: no sibling group runs as one launch; nothing to check"
        lines = [f"sibling check ({self.rounds} paired prefill rounds per T; > 1.00x: the "
                 f"group launches prefilled faster than the members alone):"]
        for g in self.groups:
            p = g.problem
            verdict = "kept" if g.kept else f"members alone ({g.reference} for {p.n}x{p.k})"
            lines.append(f"  T={p.m} {p.n}x{p.k} ({len(g.layers)} group(s), e.g. "
                         f"{g.layers[0]}): {g.tuned} {g.ratio:.2f}x (p25 {g.low:.2f}x"
                         f"{more_rounds(g.rounds, self.rounds)}) -> {verdict}")
        return "\n".join(lines)


def _groups_at(model: nn.Module, m: int) -> dict[Problem, tuple[str, list[str]]]:
    """``{summed problem: (kernel, [group labels])}`` of the groups that run as one
    launch at ``m`` tokens."""
    from ..nn import Linear

    found: dict[Problem, tuple[str, list[str]]] = {}
    modules = list(model.named_modules())
    path_of = {id(layer): path for path, layer in modules}
    seen = set()
    for _, layer in modules:
        if not isinstance(layer, Linear) or layer.siblings is None:
            continue
        if id(layer.siblings) in seen:
            continue
        seen.add(id(layer.siblings))
        decided = layer._group_decision(m, layer["scales"].dtype)
        if decided is None:
            continue
        candidate, _, members, problem = decided
        paths = [path_of[id(member)] for member in members]
        label = paths[0].rsplit(".", 1)[0] + "." + "+".join(p.rsplit(".", 1)[-1] for p in paths)
        found.setdefault(problem, (candidate.name, []))[1].append(label)
    return found


def check_siblings(
    model: nn.Module,
    tuner: Tuner | None = None,
    *,
    tokens=(128, 512),
    rounds: int = ROUNDS,
    extra_rounds: int | None = None,
    min_improvement_bps: float = MIN_IMPROVEMENT_BPS,
    record: bool = True,
    progress: Callable[[str], None] | None = None,
) -> SiblingCheck:
    """Keep sibling launches only at the prefill lengths where they make the model faster.

    Args:
        model: an mlx-lm model converted with :func:`mlx_w8a8.quantize` (siblings
            linked; its layers decide through the process-wide tuner).
        tuner: where rewritten entries are recorded (default: the process-wide tuner).
        tokens: prefill lengths ``T`` to check (each is the M of every projection).
        rounds: paired, alternating rounds per ``T`` (>= 2).
        extra_rounds: rounds added at a ``T`` whose verdict is unsettled (the median
            passes the margin, the lower quartile does not); ``None``: ``rounds``; 0:
            none.
        min_improvement_bps: how much faster the group launches must make prefill
            (basis points) to stay.
        record: write the verdicts into ``tuner``'s writable table.
        progress: called with a short message after each round.

    Returns:
        A :class:`SiblingCheck`.

    Raises:
        ValueError: for bad arguments.
    """
    from . import model_timing
    from .active import get_tuner

    tokens, extra_rounds = prefill_args(OP, tokens, rounds, extra_rounds, min_improvement_bps)
    tuner = tuner or get_tuner()
    vocab = model_timing.vocab_size(model, OP)
    results: list[GroupResult] = []
    seconds: dict[int, dict[str, list[float]]] = {}
    for t in tokens:
        groups = _groups_at(model, t)
        if not groups:
            continue
        prompt = model_timing.prompt_tokens(vocab, t)

        def measure(name: str) -> float:
            siblings.launch_together(name == "together")
            try:
                return model_timing.prefill(model, prompt)[0]
            finally:
                siblings.launch_together(True)

        # Untimed: plans built and kept, kernels compiled, compiled calls traced (a layer
        # keeps its plan from the second call at a shape: model_timing.WARMUP).
        for _ in range(model_timing.WARMUP - 1):
            for name in ("together", "alone"):
                measure(name)

        def on_round(r, order, secs, t=t):
            if progress is not None:
                progress(f"sibling check T={t} round {r + 1}/{rounds}")

        times = model_timing.alternate(["together", "alone"], rounds, measure, on_round)
        extend_unsettled(times, [("alone", "together")], extra_rounds, measure,
                         min_improvement_bps, progress, f"sibling check T={t}")
        seconds[t] = times
        ratio, low, kept = paired_verdict(times["alone"], times["together"],
                                          min_improvement_bps)
        for problem, (kernel, labels) in groups.items():
            results.append(GroupResult(problem, tuple(labels), kernel,
                                       registry.fallback(problem).name, ratio, low,
                                       kept, len(times["together"])))
    details = {"rounds": rounds, "min_improvement_bps": min_improvement_bps}
    recorded = record_verdicts(tuner, results, "sibling_check", details, OP) if record else 0
    return SiblingCheck(tuple(results), rounds, seconds, recorded)


__all__ = ["SiblingCheck", "check_siblings"]
