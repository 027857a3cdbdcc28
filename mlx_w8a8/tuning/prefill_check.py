"""Check a model's prefill decisions in the model's own prefill, against a challenger.

Per-shape timing (:mod:`.timing`) runs each sample's launches side by side: MLX's CUDA
graph has no edges between independent launches, so a kernel that leaves most SMs idle
for a long time (``mx.quantized_matmul`` at M = 128 on an NVIDIA H200: several times
bf16's GPU time per call) hides behind the launches next to it and wins races it loses
in a model, where the layers' launches depend on each other. Measured there: the
M = 128 entries chose ``mx.quantized_matmul`` for Llama-3-8B's q/k/v/o, and its kernels
took 1216 us of GPU time in a 4-layer prefill of 128 tokens whose bf16 GEMMs took 986
(2026-12-01, ``bench/gpu_timeline.py``).

So :func:`check_prefill` prefills the model at each ``T`` in paired, alternating rounds:

- ``decided``: every layer as its table entry decided;
- one variant per layer group (layers deciding by the same entry at that ``T``, alone:
  members of a sibling launch are the sibling check's) with that group forced to its
  **challenger**: the reference (``mx.quantized_matmul``) where a W8A8 kernel was chosen,
  else the fastest other candidate the entry timed that passed the gate;
- one variant per sibling group left alone because its summed entry chose a kernel
  without a multi-weight form (q/k/v of Llama-3-8B at M = 128 on an H200): the group run
  as one launch on the fastest timed kernel that has one (a chooser in front of the
  tuner's decides that summed shape, :class:`_Override`). A summed shape that is also a
  layer's own shape has one entry for both and is judged as that layer's group; one
  whose entry carries the sibling check's verdict was judged as one launch there.

A group switches to its challenger only when that variant prefills faster than
``decided`` by the tuner's margin (median of the per-round ratios) and in at least three
rounds of four (lower quartile >= 1), over extra rounds of ``decided`` and that variant
where the first ones left it unsettled (median passing, quartile not:
:func:`~mlx_w8a8.tuning.decode_check.extend_unsettled`); the entry then says the
challenger, and either way it records what the check saw (``prefill_check``). Groups
are judged one at a time against the same ``decided`` variant, not in combination.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import mlx.nn as nn

from ..kernels import registry
from ..kernels.registry import Problem
from . import linears, shapes
from .decode_check import (_dtype_at, extend_unsettled, more_rounds,
                           paired_verdict, prefill_args, PREFILL_ROUNDS)
from .tuner import MIN_IMPROVEMENT_BPS, Tuner, _now

OP = "mlx_w8a8.check_prefill"
ROUNDS = PREFILL_ROUNDS


@attrs.frozen
class PrefillResult:
    """One layer group at one prefill length.

    Args:
        problem: the group's problem (its M is the prefill length ``T``).
        layers: module paths of the group's layers.
        tuned: the kernel the table chose.
        challenger: the kernel tried instead.
        ratio: median over rounds of ``seconds(decided) / seconds(challenger)`` (> 1:
            the challenger prefilled faster).
        low: the lower quartile of those ratios.
        switched: whether the entry now says the challenger.
        rounds: the paired rounds the verdict rests on (the check's, more where they
            left it unsettled).
    """

    problem: Problem
    layers: tuple[str, ...]
    tuned: str
    challenger: str
    ratio: float
    low: float
    switched: bool
    rounds: int


@attrs.frozen
class PrefillCheck:
    """The result of :func:`check_prefill`.

    Args:
        groups: one :class:`PrefillResult` per group and prefill length.
        rounds: paired rounds per ``T``.
        seconds: ``{T: {variant: [seconds per round]}}``.
        recorded: entries written to the tuner's writable table.
    """

    groups: tuple[PrefillResult, ...]
    rounds: int
    seconds: dict
    recorded: int

    def describe(self) -> str:
        """One line per group: T, shape, kernels, ratio and verdict."""
        if not self.groups:
            return "prefill check: no layer group with a challenger; nothing to check"
        lines = [f"prefill check ({self.rounds} paired prefill rounds per T; > 1.00x: the "
                 f"challenger prefilled faster than the table's choice):"]
        for g in self.groups:
            p = g.problem
            verdict = f"switched to {g.challenger}" if g.switched else f"{g.tuned} kept"
            lines.append(f"  T={p.m} {p.n}x{p.k} ({len(g.layers)} layer(s), e.g. "
                         f"{g.layers[0]}): {g.tuned} -> {g.challenger} {g.ratio:.2f}x "
                         f"(p25 {g.low:.2f}x{more_rounds(g.rounds, self.rounds)}): {verdict}")
        return "\n".join(lines)


def _fastest_timed(entry: dict, problem: Problem, skip: str,
                   want: Callable[[Any], bool] = lambda candidate: True) -> str | None:
    """The fastest candidate ``entry`` timed (gate passed, ``status`` ok) other than
    ``skip`` for which ``want(candidate)`` holds and that can run ``problem`` here."""
    timed = {}
    for name, info in (entry.get("candidates") or {}).items():
        if name == skip or not isinstance(info, dict):
            continue
        if info.get("status") != "ok" or "median_ns" not in info:
            continue
        try:
            candidate = registry.get(problem.op, name)
        except ValueError:
            continue  # not registered here
        if want(candidate) and candidate.handles(problem):
            timed[name] = info["median_ns"]
    return min(timed, key=timed.get) if timed else None


def challenger(entry: dict, problem: Problem) -> str | None:
    """The kernel :func:`check_prefill` tries instead of ``entry``'s choice: the
    reference where the choice is another kernel, else the fastest other candidate the
    entry timed (gate passed, ``status`` ok) that can run ``problem`` here; ``None``
    when there is none."""
    reference = entry["reference"]
    if entry["choice"] != reference:
        return reference
    return _fastest_timed(entry, problem, reference)


def group_challenger(entry: dict, problem: Problem) -> str | None:
    """The kernel tried for a sibling group whose summed entry chose one without a
    multi-weight form: the fastest candidate the entry timed (gate passed, ``status``
    ok) that has one (``Candidate.bind_group``) and can run ``problem`` here; ``None``
    when there is none."""
    return _fastest_timed(entry, problem, entry["choice"],
                          lambda candidate: candidate.bind_group is not None)


class _Override:
    """A chooser in front of the installed one that decides one summed problem (the
    routed one) with its challenger, so its siblings run as one launch on it; routing
    another (or none) installs it again, which makes every layer plan again
    (``registry.set_chooser`` invalidates)."""

    def __init__(self, alt: dict):
        self.alt, self.problem, self.previous = alt, None, None

    def route(self, problem: Problem | None) -> None:
        if problem == self.problem:
            return
        if self.problem is not None:
            registry.set_chooser(self.previous)
        self.problem = problem
        if problem is not None:
            self.previous = registry.set_chooser(self)

    def __call__(self, problem: Problem, found):
        if problem == self.problem:
            for candidate in found:
                if candidate.name == self.alt[problem]:
                    return candidate, "prefill check"
        return self.previous(problem, found) if self.previous is not None else None


def _hit_at(tuner: Tuner, problem: Problem, t: int):
    """The entry deciding ``problem`` if it is one of length ``t``'s M bucket (another
    bucket's, borrowed, is not this length's to rewrite), else ``None``."""
    hit = tuner.lookup(problem)
    return hit if hit is not None and hit.entry["m_bucket"] == shapes.bucket(t) else None


def _label(path_of: dict, members) -> str:
    """``parent.q_proj+k_proj+v_proj`` for a sibling group's ``members``."""
    paths = [path_of.get(id(member), "?") for member in members]
    parent = paths[0].rsplit(".", 1)[0] if "." in paths[0] else ""
    names = "+".join(p.rsplit(".", 1)[-1] for p in paths)
    return f"{parent}.{names}" if parent else names


def check_prefill(
    model: nn.Module,
    tuner: Tuner | None = None,
    *,
    tokens=(128,),
    rounds: int = ROUNDS,
    extra_rounds: int | None = None,
    min_improvement_bps: float = MIN_IMPROVEMENT_BPS,
    record: bool = True,
    progress: Callable[[str], None] | None = None,
) -> PrefillCheck:
    """Switch a prefill entry to its challenger where that makes the model's prefill
    faster.

    Args:
        model: an mlx-lm model converted with :func:`mlx_w8a8.quantize` (its layers
            decide through the process-wide tuner).
        tuner: where rewritten entries are recorded (default: the process-wide tuner).
            It should be the tuner the layers decide with.
        tokens: prefill lengths ``T`` to check (each is the M of every projection).
        rounds: paired, alternating rounds per ``T`` (>= 2).
        extra_rounds: rounds added for a group whose verdict is unsettled (the median
            passes the margin, the lower quartile does not); ``None``: ``rounds``; 0:
            none.
        min_improvement_bps: how much faster (basis points) the challenger must make
            prefill to be switched to.
        record: write the verdicts into ``tuner``'s writable table.
        progress: called with a short message after each round.

    Returns:
        A :class:`PrefillCheck`.

    Raises:
        ValueError: for bad arguments or a model without ``mlx_w8a8.Linear`` layers.
    """
    from . import model_timing
    from .active import get_tuner

    tokens, extra_rounds = prefill_args(OP, tokens, rounds, extra_rounds, min_improvement_bps)
    layers = linears.w8a8_linears(model)
    if not layers:
        raise ValueError(f"[{OP}] {type(model).__name__} has no mlx_w8a8.Linear layers "
                         f"(convert it with mlx_w8a8.quantize first)")
    tuner = tuner or get_tuner()
    vocab = model_timing.vocab_size(model, OP)
    results: list[PrefillResult] = []
    hits: dict[Problem, Any] = {}
    seconds: dict[int, dict[str, list[float]]] = {}
    path_of = {id(layer): path for path, layer in layers}
    for t in tokens:
        prompt = model_timing.prompt_tokens(vocab, t)
        model_timing.prefill(model, prompt)  # every layer meets M = t and decides
        # Layer groups: layers deciding alone by the same entry of this length.
        groups: dict[Problem, list[tuple[str, Any]]] = {}
        # Sibling groups whose summed entry chose a kernel without a multi-weight form
        # (so they run alone): challenged with the fastest timed kernel that has one.
        sums: dict[Problem, list[tuple[str, Any]]] = {}
        alt: dict[Problem, str] = {}
        alt_sum: dict[Problem, str] = {}
        seen_sums: set[int] = set()
        for path, layer in layers:
            dtype = _dtype_at(layer, t)
            if layer.kernel is not None or dtype is None:
                continue  # forced by the user, or not called with T tokens
            if layer._group_decision(t, dtype) is not None:
                continue  # one launch with its siblings: the sibling check judges it
            problem = layer.problem(t, dtype)
            hit = _hit_at(tuner, problem, t)
            if hit is not None and layer.decision(t, dtype)[0] == hit.choice:
                other = challenger(hit.entry, problem)
                if other is not None:
                    groups.setdefault(problem, []).append((path, layer))
                    alt[problem], hits[problem] = other, hit
            found = layer._group_problem(t, dtype)
            if found is None or id(layer.siblings) in seen_sums:
                continue
            seen_sums.add(id(layer.siblings))
            members, summed = found
            hit = _hit_at(tuner, summed, t)
            if hit is None or "sibling_check" in hit.entry:
                continue  # none, or the sibling check judged this group's launch already
            other = group_challenger(hit.entry, summed)
            if other is not None:
                sums.setdefault(summed, []).append((_label(path_of, members), members))
                alt_sum[summed], hits[summed] = other, hit
        # A summed shape that is also some layer's own shape has one entry for both: it
        # is judged as that layer group's.
        sums = {p: v for p, v in sums.items() if p not in groups}
        alt.update((p, alt_sum[p]) for p in sums)
        if not groups and not sums:
            continue
        problems = list(groups) + list(sums)
        variants = {"decided": None, **{f"group {i}": p for i, p in enumerate(problems)}}
        chooser = _Override(alt)

        def arrange(name: str) -> None:
            switch = variants[name]
            for p in groups:
                for _, layer in groups[p]:
                    want = alt[p] if p == switch else None
                    if layer.kernel != want:
                        layer.kernel = want
            chooser.route(switch if switch in sums else None)

        def measure(name: str) -> float:
            # Hazard: a layer whose kernel is switched forgets its plans and makes new
            # ones (decide, bind) on its next call: tens of microseconds per layer of
            # host time, a large share of a short prefill. An untimed prefill after the
            # switch makes them, so the timed one runs only the kernels.
            arrange(name)
            model_timing.prefill(model, prompt)
            return model_timing.prefill(model, prompt)[0]

        def on_round(r, order, secs, t=t):
            if progress is not None:
                progress(f"prefill check T={t} round {r + 1}/{rounds}")

        try:
            for name in variants:  # untimed: plans built, kernels compiled
                measure(name)
            times = model_timing.alternate(list(variants), rounds, measure, on_round)
            extend_unsettled(times, [("decided", v) for v in list(variants)[1:]], extra_rounds,
                             measure, min_improvement_bps, progress, f"prefill check T={t}")
        finally:
            for p in groups:
                for _, layer in groups[p]:
                    if layer.kernel is not None:
                        layer.kernel = None
            chooser.route(None)
        seconds[t] = times
        for i, p in enumerate(problems):
            ratio, low, switch = paired_verdict(times["decided"], times[f"group {i}"],
                                                min_improvement_bps)
            layers_of = groups.get(p) or sums[p]
            results.append(PrefillResult(
                p, tuple(path for path, _ in layers_of), hits[p].choice, alt[p], ratio, low,
                switch, len(times[f"group {i}"])))
    recorded = _record(tuner, results, hits, min_improvement_bps) if record else 0
    return PrefillCheck(tuple(results), rounds, seconds, recorded)


def _record(tuner: Tuner, results, hits, min_improvement_bps: float) -> int:
    """Write each group's verdict into the entry that decided it (its choice becomes the
    challenger where it switched). Returns the entries written."""
    count = 0
    for g in results:
        entry = dict(hits[g.problem].entry)
        entry["prefill_check"] = {
            "tuned": g.tuned, "challenger": g.challenger, "ratio": round(g.ratio, 4),
            "p25": round(g.low, 4), "switched": g.switched, "rounds": g.rounds,
            "min_improvement_bps": min_improvement_bps, "checked_at": _now(),
        }
        if g.switched:
            entry["choice"] = g.challenger
            med = {n: c.get("median_ns") for n, c in entry["candidates"].items()}
            ref, new = med.get(entry["reference"]), med.get(g.challenger)
            entry["speedup"] = round(ref / new, 4) if ref and new else 1.0
        claim = tuner.claim(g.problem)
        if claim is None:
            continue  # being measured by another tuner: its entry will say
        tuner.record(claim, entry)
        count += 1
    return count


__all__ = ["PrefillCheck", "PrefillResult", "check_prefill", "challenger"]
