"""Event-free paired timing: wall clock around ``mx.eval``.

Method (after the paired qualification bench): every candidate is warmed up, then a
sample is ``chain`` launches built and evaluated in one ``mx.eval``, timed with
``time.perf_counter`` and divided by ``chain`` (graph construction is inside the timed
region: the Python cost of building a candidate's graph is part of what a caller
pays). With a ``link`` (:func:`linear_link` for linears, what the tuner and the bench
pass) each launch's activation is made from the previous launch's output, so the chain
is a dependent one as a model's successive layers are: MLX's CUDA graph runs launches
with no data edge between them side by side, and a chain of independent small launches
measured several times faster per launch than the same launches fed one from the other
(on an NVIDIA H200: ``mx.quantized_matmul`` at M = 16 on 4096 x 4096, 16.5 against
61.7 us per launch; docs/tuning.md). Rounds run every candidate once, in alternating order (A B, then B A, ...), so
drift of the machine (clocks, thermal state, other load) hits all candidates alike;
at least 30 rounds are the default, and each candidate's median is its score. Launches
rotate through several input tuples so that a small activation does not sit in cache
between launches as it would not in a model. A candidate that raises is marked
``unavailable`` and dropped from later rounds; the others go on.

No device events are used, so the same code times CPU, Metal and CUDA.

A linked chain is checked against the same launches unlinked: after the rounds each arm
times :data:`UNLINKED_SAMPLES` pairs of chains, one without the link and one with it,
alternating, and an arm is marked ``implausible`` where both its linked median and its
best linked chain of those pairs are faster than its best unlinked chain by more than
:data:`IMPLAUSIBLE_RATIO`. A dependent chain does the unlinked chain's work plus one add
per link and cannot run faster per launch (CUDA graphs may overlap the unlinked
launches, never the linked ones). The linked chains timed beside the unlinked ones see
the host's load of that moment too: against the rounds' median alone, unlinked chains
timed during a burst of other work (a 2-core CI machine) once looked 2x slower. (Tiny
launches, host-bound, can time faster linked than unlinked at their best, which is why
the median must agree.) Hazard this guards against: on an NVIDIA H100 (MLX 0.32.4) a race of
every group-wise candidate at M = 16 timed ``mx.quantized_matmul``'s linked chains of
the lm_head (525 MB of codes) at 18-46 us a launch after its first round, where the same
launches unlinked took 340 us; a table built on such samples sends a shape to a kernel
for a time it never ran at. The cause there was a kernel compiled in clusters, since
built without (docs/cuda.md, "CUDA graphs and clusters"); the check stays for any other
way a chain's launches could go unrun.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Collection, Sequence

import attrs
import mlx.core as mx
import numpy as np

log = logging.getLogger("mlx_w8a8.tuning")

PAIRS = 30
WARMUP = 2
MAX_CHAIN = 32
# Aim for samples of at least this long so timer resolution and Python overhead of
# one eval do not dominate short kernels (a GPU GEMV is ~10 us).
TARGET_SAMPLE_S = 0.002
# The tuner's pruning: an arm whose first timed round (a whole chain, per launch) takes
# more than PRUNE_RATIO times the fastest arm's, and at least PRUNE_MIN_S, is timed in
# that round only. It cannot win, and on large shapes such arms (the exact reference
# kernel, mx.quantized_matmul at large M) took most of a tuning run's time. The minimum
# keeps short arms in every round: their samples are too noisy (host jitter of tens of
# microseconds) to rule them out, and short arms are cheap to time anyway.
# Hazard: the decision must not rest on one launch. It once did (the single warm launch
# that sizes the chain): on an NVIDIA H200 one slow such launch of the TMA linear at
# M = 2048, N = 4096, K = 14336 pruned it, and its lone sample lost to a kernel that
# 30 full rounds then measured 12% slower than it.
PRUNE_RATIO = 4.0
PRUNE_MIN_S = 0.0005
# The linked-chain check (module docstring): an arm's linked median and its best linked
# chain beside the unlinked ones, both below its best unlinked chain (per launch)
# divided by this, are implausible; each best is of this many chains timed in
# alternation (a host stall only lengthens a sample, so the best is the least disturbed).
IMPLAUSIBLE_RATIO = 2.0
UNLINKED_SAMPLES = 3


@attrs.frozen
class Timing:
    """One candidate's samples.

    Args:
        name: the candidate.
        samples_ns: per-launch nanoseconds, one per round it completed.
        status: ``"ok"``, ``"unavailable"`` (raised during warm-up or timing) or
            ``"implausible"`` (its linked chains, in the rounds and beside the unlinked
            ones, timed faster than the same launches unlinked by more than
            :data:`IMPLAUSIBLE_RATIO`; the samples are kept).
        detail: the error, or why the samples are implausible.
        unlinked_ns: per-launch nanoseconds of the same chain without the link (the
            best of :data:`UNLINKED_SAMPLES`); ``None`` where not measured.
    """

    name: str
    samples_ns: tuple[float, ...] = ()
    status: str = "ok"
    detail: str = ""
    unlinked_ns: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and len(self.samples_ns) > 0

    @property
    def median_ns(self) -> float:
        return float(np.median(self.samples_ns)) if self.samples_ns else math.inf

    @property
    def p25_ns(self) -> float:
        return float(np.percentile(self.samples_ns, 25)) if self.samples_ns else math.inf

    @property
    def p75_ns(self) -> float:
        return float(np.percentile(self.samples_ns, 75)) if self.samples_ns else math.inf

    @property
    def spread_ns(self) -> float:
        """Interquartile range of the samples (p75 - p25)."""
        return self.p75_ns - self.p25_ns


@attrs.frozen
class Measurement:
    """The result of :func:`paired_measure`.

    Args:
        timings: ``{name: Timing}`` for every arm, in the order given.
        chain: launches per sample.
        rounds: rounds run.
        pruned: arms timed in the first round only (``prune_ratio``).
    """

    timings: dict
    chain: int
    rounds: int
    pruned: tuple[str, ...] = ()

    def ratios(self, baseline: str, other: str) -> list[float]:
        """Per-round ``other / baseline`` time ratios (paired samples)."""
        a, b = self.timings[baseline].samples_ns, self.timings[other].samples_ns
        return [y / x for x, y in zip(a, b) if x > 0]


def linear_link(out: Any, args: tuple) -> tuple:
    """The next launch's arguments ``(x, w, b)`` with ``x`` made from the previous
    launch's output ``out`` (``[..., N]``; a list or tuple: its first array):
    ``x + out[..., :1]``, one broadcast add the chain's every arm pays alike, and a data
    edge in MLX's graph (``mx.depends`` adds none). The values stay of ``x``'s scale for
    outputs of its scale (the gate's operands)."""
    y = out[0] if isinstance(out, (list, tuple)) else out
    return (args[0] + y[..., :1].astype(args[0].dtype), *args[1:])


def _implausible(linked_ns: float, unlinked_ns: float) -> bool:
    """Whether linked chains of ``linked_ns`` per launch are implausibly fast next to the
    same launches unlinked (``unlinked_ns`` per launch), both timed side by side."""
    return linked_ns * IMPLAUSIBLE_RATIO < unlinked_ns


def _launch(fn: Callable[..., Any], inputs: Sequence[tuple], start: int, count: int,
            link: Callable[[Any, tuple], tuple] | None = None) -> float:
    """Build ``count`` launches of ``fn`` over rotated inputs (each made from the one
    before by ``link`` when given), eval once; seconds."""
    t0 = time.perf_counter()
    outs = []
    for j in range(count):
        args = inputs[(start + j) % len(inputs)]
        if link is not None and outs:
            args = link(outs[-1], args)
        outs.append(fn(*args))
    mx.eval(outs)
    return time.perf_counter() - t0


def paired_measure(
    arms: Sequence[tuple[str, Callable[..., Any]]],
    inputs: Sequence[tuple],
    pairs: int = PAIRS,
    warmup: int = WARMUP,
    chain: int | None = None,
    max_chain: int = MAX_CHAIN,
    target_sample_s: float = TARGET_SAMPLE_S,
    progress: Callable[[int], None] | None = None,
    prune_ratio: float | None = None,
    keep: Sequence[str] = (),
    link: Callable[[Any, tuple], tuple] | None = None,
) -> Measurement:
    """Time ``arms`` in alternating-order rounds.

    Args:
        arms: ``(name, fn)`` pairs; ``fn(*args)`` returns an ``mx.array`` (or a
            tuple of them) lazily.
        inputs: argument tuples, rotated through launch by launch.
        pairs: rounds (each gives every arm one sample); the default is 30.
        warmup: untimed launches per arm first (each its own eval).
        chain: launches per sample; ``None`` picks the smallest count that makes the
            fastest arm's sample at least ``target_sample_s``, capped at ``max_chain``.
        progress: called with 1 after each round (e.g. a tqdm bar's ``update``).
        prune_ratio: an arm whose first round's sample (per launch, a whole chain) is
            slower than the fastest arm's by more than this factor, and at least
            :data:`PRUNE_MIN_S`, gets that one timed round instead of ``pairs``;
            ``None`` (the default, what a benchmark wants) times every arm in every
            round. The tuner passes :data:`PRUNE_RATIO`.
        keep: arms never pruned (the tuner's reference, whose median every ratio and
            the margin rule need).
        link: ``link(previous_output, next_args) -> next_args``: each launch of a
            sample after the first gets arguments made from the previous launch's
            output (:func:`linear_link`), a dependent chain; ``None``: independent
            launches. With a link, each arm timed in every round is checked against
            its chain unlinked (module docstring).

    Returns:
        A :class:`Measurement`; an arm that raised has status ``"unavailable"``, one
        whose linked chains timed implausibly fast ``"implausible"``.

    Raises:
        ValueError: if ``pairs < 1``, ``warmup < 0``, ``prune_ratio < 1`` or there are
            no inputs.
    """
    if pairs < 1 or warmup < 0 or not inputs or (prune_ratio is not None and prune_ratio < 1):
        raise ValueError(
            f"[mlx_w8a8.tuning.timing] need pairs >= 1, warmup >= 0, prune_ratio >= 1 (or "
            f"None) and inputs; got pairs={pairs}, warmup={warmup}, prune_ratio={prune_ratio}, "
            f"{len(inputs)} input tuples"
        )
    samples: dict[str, list[float]] = {name: [] for name, _ in arms}
    failed: dict[str, str] = {}
    fns = dict(arms)

    def guarded(name: str, count: int, start: int, linked: bool = True) -> float | None:
        try:
            return _launch(fns[name], inputs, start, count, link if linked else None)
        except Exception as error:  # a crashing candidate is skipped, never fatal
            failed[name] = f"{type(error).__name__}: {error}"
            log.warning("[mlx_w8a8.tuning] candidate %r failed while timed (%s); skipped",
                        name, failed[name])
            return None

    singles: dict[str, float] = {}
    for name in fns:
        for i in range(warmup):
            if guarded(name, 1, i) is None:
                break
        if name not in failed:
            t = guarded(name, 1, warmup)
            if t is not None:
                singles[name] = t
    if chain is None:
        fastest = min(singles.values()) if singles else target_sample_s
        chain = int(min(max_chain, max(1, math.ceil(target_sample_s / max(fastest, 1e-9)))))
    chain = max(1, int(chain))

    names = list(fns)
    pruned: tuple[str, ...] = ()
    for r in range(pairs):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            if name in failed or name in pruned:
                continue
            t = guarded(name, chain, r * chain)
            if t is not None:
                samples[name].append(t * 1e9 / chain)
        if r == 0 and prune_ratio is not None:
            first = {n: samples[n][0] * 1e-9 for n in names if samples[n] and n not in failed}
            if first:
                bar = max(prune_ratio * min(first.values()), PRUNE_MIN_S)
                pruned = tuple(n for n in names if n not in keep and first.get(n, 0.0) > bar)
        if progress is not None:
            progress(1)
    unlinked: dict[str, float] = {}
    linked_beside: dict[str, float] = {}  # the best linked chain timed beside them
    if link is not None:
        for name in names:
            if name in failed or name in pruned or not samples[name]:
                continue
            best = {False: None, True: None}
            for i in range(2 * UNLINKED_SAMPLES):  # unlinked, linked, unlinked, ...
                linked = i % 2 == 1
                t = guarded(name, chain, (pairs + i) * chain, linked=linked)
                if t is None:
                    break
                best[linked] = t if best[linked] is None else min(best[linked], t)
            if name not in failed and best[False] is not None and best[True] is not None:
                unlinked[name] = best[False] * 1e9 / chain
                linked_beside[name] = best[True] * 1e9 / chain
    timings = {}
    for name in names:
        t = Timing(name, tuple(samples[name]) if name not in failed else (),
                   "unavailable" if name in failed else "ok", failed.get(name, ""),
                   unlinked.get(name))
        if (t.ok and t.unlinked_ns is not None and _implausible(t.median_ns, t.unlinked_ns)
                and _implausible(linked_beside[name], t.unlinked_ns)):
            detail = (f"linked chains of {chain} timed {t.median_ns / 1e3:.1f} us a launch "
                      f"({linked_beside[name] / 1e3:.1f} us at best beside the unlinked "
                      f"ones), the same launches unlinked {t.unlinked_ns / 1e3:.1f} us: a "
                      f"dependent chain cannot run {IMPLAUSIBLE_RATIO:g}x faster, so these "
                      f"samples are not used")
            log.warning("[mlx_w8a8.tuning] candidate %r: %s", name, detail)
            t = attrs.evolve(t, status="implausible", detail=detail)
        timings[name] = t
    return Measurement(timings, chain, pairs, tuple(n for n in pruned if n not in failed))


def select_fastest(
    medians: dict[str, float], reference: str, min_improvement_bps: float,
    prefer: Collection[str] = (), incumbent: str | None = None,
) -> str:
    """The fastest candidate, if it beats ``reference`` by ``min_improvement_bps``.

    After ``select_fastest_candidate`` of the seed: a challenger is chosen only when
    ``t_c <= t_ref * (1 - bps / 10000)``; otherwise (or when the reference has no
    finite time and nothing else does either) the reference stays.

    The same margin is the tuner's notion of "not clearly faster" between challengers:
    when the fastest is not in ``prefer`` but a challenger in ``prefer`` is within the
    margin of it (``t_p * (1 - bps / 10000) <= t_fastest``), the fastest such one is
    chosen instead, provided it beats the reference by the margin itself. The tuner
    prefers candidates with a multi-weight form (``Candidate.bind_group``): for a
    sibling group's summed shape only those launch the group as one, which per-shape
    timing cannot see (the sibling check then judges it in the model).

    The same holds for ``incumbent``, the choice a table already records for the
    problem (a re-measurement): it stays unless another candidate is faster by the
    margin (and, if it is not the reference, while it beats the reference by the margin
    itself), so re-measuring a table moves only the choices that clearly changed. Races
    within the margin decide nothing the model can rely on: branch ``bound-objects``'s
    re-measured H200 table moved 12 choices between two GEMMs 0.5-7% apart, and on it
    the 32-layer prefill at T = 512 ran 4-7% below the table it replaced (15-17% at new
    lengths) in both process orders, where on the replaced table's choices the same
    code matched it in the one pair run (NVIDIA H200, 2026-12-02).

    Args:
        medians: ``{name: median seconds or ns}``; non-finite values are ignored.
        reference: the name kept when no challenger wins clearly.
        min_improvement_bps: the margin in basis points (100 bps = 1 %).
        prefer: challengers chosen over a faster one within the margin.
        incumbent: the choice on record, kept over a faster one within the margin
            (after ``prefer``: a preferred fastest is not replaced by an incumbent
            outside ``prefer``); ``None`` or not timed here: no incumbent.

    Raises:
        ValueError: if ``min_improvement_bps`` is negative or >= 10000.
    """
    if not 0 <= min_improvement_bps < 10000:
        raise ValueError(
            f"[mlx_w8a8.tuning] min_improvement_bps must be in [0, 10000), got {min_improvement_bps}"
        )
    finite = {n: t for n, t in medians.items() if math.isfinite(t)}
    if not finite:
        return reference
    fastest = min(finite, key=lambda n: (finite[n], n != reference))
    if fastest == reference:
        return reference
    keep = 1.0 - min_improvement_bps / 10000.0
    preferred = [n for n in finite if n in prefer and n != reference
                 and finite[n] * keep <= finite[fastest]]
    if fastest not in prefer and preferred:
        candidate = min(preferred, key=lambda n: finite[n])
        if finite[candidate] <= finite.get(reference, math.inf) * keep:
            fastest = candidate
    if (incumbent is not None and incumbent != fastest and incumbent in finite
            and finite[incumbent] * keep <= finite[fastest]
            and (incumbent in prefer or fastest not in prefer)):
        if incumbent == reference:
            return reference
        if finite[incumbent] <= finite.get(reference, math.inf) * keep:
            fastest = incumbent
    t_ref = finite.get(reference, math.inf)
    if not math.isfinite(t_ref):
        return fastest  # the reference could not be timed; the fastest passed the gate
    if finite[fastest] <= t_ref * keep:
        return fastest
    return reference
