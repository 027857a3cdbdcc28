"""Check a model's single-token decode decisions in the model itself.

Per-shape timing (:mod:`.timing`) charges a kernel its host cost (building and encoding
the launch) plus its device time, one after the other. A decode step of a real model
overlaps them: mlx-lm's loop launches step ``t + 1`` before it reads token ``t``, so a
step costs about the larger of the host's and the device's totals. When the host is
the bottleneck — as in mlx-lm decode on an NVIDIA H200 with Llama-3-8B's shapes, where
bf16 and 8-bit decode ran at the same speed — a kernel that saves device time but costs
more host time (a custom-kernel launch is dearer to build than a built-in op) wins its
per-shape race and still makes the model slower: measured there, a table whose M = 1
entries chose the W8A8 GEMV for gate/up and lm_head decoded at 0.80x the
``mx.quantized_matmul`` model.

So :func:`check_decode` runs the model's own decode loop (``mlx_lm``'s
``generate_step``, or :func:`mlx_w8a8.tuning.model_timing.generate_steps` where it cannot be
imported) in paired, alternating rounds, first on the decisions as a whole:

- ``every group tuned``: every layer on its tuned kernel, as the tables decide it;
- ``every group on the reference``: every layer group whose decision is not the
  reference kernel (``mx.quantized_matmul``) forced onto it, sibling members included.

Where the first decodes faster than the second by the tuner's margin (median of the
per-round ratios) and in at least three rounds of four (lower quartile of the ratios
>= 1), every group keeps its kernel (``whole``). Otherwise each group is judged alone,
in more rounds of

- ``tuned``: every layer on its tuned kernel, as above;
- one variant per group: that group alone taken off its tuned kernel, every other group
  left on its own (``without group i``);

and keeps its kernel only if ``tuned`` decodes faster than its variant by the same rule;
a group that does not has its entry rewritten with the reference as the choice. Where
the median passes and the quartile does not, the verdict is unsettled rather than lost:
as many rounds again (by default) are run for the pair, and the rule is applied to all
of them (:func:`extend_unsettled`, shared with the sibling and prefill checks). Either
way the entry records what the check saw (``decode_check``, with ``judged_in``:
``whole`` or ``tuned``).

Sibling layers that run as one launch (:mod:`mlx_w8a8.siblings`: q/k/v, gate/up) are
decided by their summed problem's entry, so they are grouped, judged and rewritten under
that problem; taken off alone, each member runs alone on its own decision (what runs
once the summed entry says the reference), not necessarily on the reference itself.
Where a replaced sibling launch leaves members on kernels other than the reference, a
second pass judges those decisions the same way.

Invariants, both because a step costs about the larger of its host and device totals,
so gains do not add (``tests/test_decode_check.py`` builds models of each case):

- The whole first: one group's share of a step may lie below the step's noise where the
  decisions together do not. In the batched decode of 32 Llama-3-8B layers on an NVIDIA
  H100, steps on W8A8 kernels spread by up to 2x between rounds; over seven runs the
  per-group verdicts fell either way while every linear on its tuned kernel decoded
  1.25-2.13x faster than on the reference in six (docs/tuning.md). The price: a group
  that costs a little is kept with the others when they win as a whole.
- Alone, a group is taken off the configuration the tables decide, not added to an
  all-reference one: where the reference arrangement is bound by the host, a group that
  saves device time shows no gain there, though the tuned model needs it.

Groups are judged one at a time, not in every combination: a deliberate simplification
(a variant per pair of groups would grow as the square of the groups).

Batched decode (mlx-lm's server decodes up to 32 sequences at once by default) runs its
linears at M = B rows per step, so for each batch size B in ``batches`` (2 .. 64) the
same rounds and rule judge the M = B decisions in the model's own batched decode of B
sequences, one token each per step (:func:`mlx_w8a8.tuning.model_timing.batch_decode`:
mlx-lm's ``BatchGenerator``, or its replica). Only decisions made by an entry of the
M = B bucket itself are judged there (a decision snapped from another bucket is that
bucket's to judge), and a B with none is not timed. Its verdicts go into the M = B
entries' ``decode_check``, with ``batch`` = B.
"""

from __future__ import annotations

import logging
import statistics
from typing import Any, Callable, Sequence

import attrs
import mlx.core as mx
import mlx.nn as nn

from ..kernels import registry
from ..kernels.registry import Problem
from . import linears, shapes
from .tuner import MIN_IMPROVEMENT_BPS, Tuner, _now

log = logging.getLogger("mlx_w8a8.tuning")

OP = "mlx_w8a8.check_decode"
STEPS = 32
PROMPT = 8
# Decode-step timing is noisy (per-round ratios of one configuration against itself
# spread by +-10% on an H200): 20 rounds, and a kept kernel must win in at least three
# rounds of four (lower quartile of the ratios >= 1) besides the median margin. With 6
# rounds of 16 steps the verdict on lm_head flipped between two runs (0.97x, then 1.08x),
# and what the second kept decoded at 0.93x; 20 rounds of 32 steps with the quartile
# rule replaced it (0.97x, p25 0.92x; bench/results/h200_2026-11-30_s2_{b,f,g}_*).
ROUNDS = 20
# The sibling and prefill checks' paired rounds per prefill length (their ROUNDS, and
# tune's --prefill-rounds default).
PREFILL_ROUNDS = 10
# arrange()'s variant with every group's layers on the reference (the whole table's baseline).
EVERY = object()
# The variants of the first stage, (base, variant): their seconds are DecodeCheck.seconds'
# entries of these names (prefixed "B = <B> " for a batch size B).
WHOLE = ("every group on the reference", "every group tuned")
# Batch sizes of the batched decode check: mlx-lm's server decodes up to 32 sequences at
# once by default, and tune --model measures M = 2 .. 64 on a GPU.
BATCHES = (2, 4, 8, 16, 32, 64)


@attrs.frozen
class GroupResult:
    """One layer group (same problem at the check's M) in the check.

    Args:
        problem: the group's problem at M = 1, or at M = B for the batched decode of B
            sequences.
        layers: module paths of the group's layers.
        tuned: the kernel the tables chose for it.
        reference: the reference kernel.
        ratio: median over rounds of ``seconds(the group off its tuned kernel) /
            seconds(the group on it)`` (> 1: the tuned kernel made decode faster).
        low: the lower quartile of those ratios.
        kept: whether the tuned kernel stays (``ratio`` >= the margin and ``low`` >= 1).
        rounds: the paired rounds the verdict rests on (the check's rounds, more where
            they left it unsettled: :func:`extend_unsettled`).
        whole: the verdict is that of the check's decisions as a whole (every group
            tuned against every group on the reference), ``ratio`` and ``low`` theirs.
    """

    problem: Problem
    layers: tuple[str, ...]
    tuned: str
    reference: str
    ratio: float
    low: float
    kept: bool
    rounds: int
    whole: bool = False


@attrs.frozen
class DecodeCheck:
    """The result of :func:`check_decode`.

    Args:
        groups: one :class:`GroupResult` per group whose tuned kernel was not the
            reference (empty: nothing to check), B = 1's first, then each batch size's.
        steps, rounds: decode steps per sample and paired rounds.
        seconds: ``{variant: [seconds per round]}`` (a second pass's variants end in
            `` (pass 2)``).
        recorded: entries written to the tuner's writable table.
        batches: the batch sizes B > 1 whose batched decode was timed (their groups'
            ``problem.m`` is B; ``seconds``' variants for them start with ``"B = <B> "``).
    """

    groups: tuple[GroupResult, ...]
    steps: int
    rounds: int
    seconds: dict
    recorded: int
    batches: tuple[int, ...] = ()

    def describe(self) -> str:
        """One line per group: its shape, kernels, ratio and verdict."""
        if not self.groups:
            return ("decode check: every M = 1 decision, and every decision of a measured "
                    "M = 2 .. 64 bucket, is the reference; nothing to check")
        lines = [f"decode check ({self.steps} steps x {self.rounds} paired rounds; "
                 f"> 1.00x: the model decoded faster on the tuned kernels: every group "
                 f"against every group on the reference (as a whole), else each group "
                 f"against it alone taken off):"]
        stated = set()  # the batch sizes whose stage "as a whole" has its line
        for g in self.groups:
            p = g.problem
            verdict = "kept" if g.kept else f"replaced by {g.reference}"
            batch = "" if p.m == 1 else f"B = {p.m} (batched decode, M = {p.m}): "
            if not g.whole and p.m not in stated:
                # Judged each group alone: say what the decisions as a whole did first.
                stated.add(p.m)
                prefix = "" if p.m == 1 else f"B = {p.m} "
                pair = [self.seconds.get(prefix + name) for name in WHOLE]
                if all(pair):
                    ratio, low, _ = paired_verdict(*pair, 0.0)
                    lines.append(f"  {batch}as a whole: every group tuned {ratio:.2f}x "
                                 f"(p25 {low:.2f}x) -> each group judged alone:")
            lines.append(
                f"  {batch}{p.n}x{p.k} ({len(g.layers)} layer(s), e.g. {g.layers[0]}): "
                f"{g.tuned} {g.ratio:.2f}x (p25 {g.low:.2f}x{more_rounds(g.rounds, self.rounds)})"
                f"{' as a whole' if g.whole else ''} -> {verdict}"
            )
        return "\n".join(lines)


def paired_verdict(base: list[float], variant: list[float],
                   min_improvement_bps: float) -> tuple[float, float, bool]:
    """``(ratio, low, wins)`` of paired rounds (seconds per round, in pairs): the median
    and lower quartile of ``base / variant`` (> 1: the variant was faster), and whether
    the variant wins, the model checks' rule: faster by the margin (median) and in at
    least three rounds of four (lower quartile >= 1)."""
    ratios = [b / v for b, v in zip(base, variant) if v > 0]
    ratio = statistics.median(ratios) if ratios else 0.0
    low = statistics.quantiles(ratios, n=4)[0] if len(ratios) >= 2 else ratio
    return ratio, low, _past_margin(ratio, min_improvement_bps) and low >= 1.0


def check_margin(op: str, min_improvement_bps: float) -> None:
    """Raise the ``ValueError`` of op ``op`` for a margin outside ``[0, 10000)`` basis
    points (the three model checks')."""
    if not 0 <= min_improvement_bps < 10000:
        raise ValueError(
            f"[{op}] min_improvement_bps must be in [0, 10000), got {min_improvement_bps}")


def prefill_args(op: str, tokens, rounds: int, extra_rounds: int | None,
                 min_improvement_bps: float) -> tuple[list[int], int]:
    """The sibling and prefill checks' arguments, validated for op ``op``: the sorted
    distinct prefill lengths and the extra rounds (``None``: ``rounds``)."""
    tokens = sorted({int(t) for t in tokens})
    extra_rounds = rounds if extra_rounds is None else extra_rounds
    if not tokens or tokens[0] < 1 or rounds < 2 or extra_rounds < 0:
        raise ValueError(f"[{op}] need token counts >= 1, rounds >= 2 and extra_rounds >= 0;"
                         f" got tokens={tokens}, rounds={rounds}, extra_rounds={extra_rounds}")
    check_margin(op, min_improvement_bps)
    return tokens, extra_rounds


def _past_margin(ratio: float, min_improvement_bps: float) -> bool:
    """The rule's first part: the median ratio beats the margin."""
    return ratio >= 1.0 + min_improvement_bps / 10000.0


def more_rounds(rounds: int, first: int) -> str:
    """``", 20 rounds"`` for a verdict extended past the check's ``first`` rounds, else
    ``""`` (the reports' lines)."""
    return f", {rounds} rounds" if rounds != first else ""


def unsettled(ratio: float, low: float, min_improvement_bps: float) -> bool:
    """Whether a verdict of :func:`paired_verdict` is one more rounds may settle: the
    variant faster by the margin in the median but not in three rounds of four."""
    return _past_margin(ratio, min_improvement_bps) and low < 1.0


def extend_unsettled(seconds: dict[str, list[float]], pairs, extra: int,
                     measure: Callable[[str], float], min_improvement_bps: float,
                     progress: Callable[[str], None] | None = None,
                     label: str = "check") -> list[str]:
    """The model checks' second look: where the verdict of a pair ``(base, variant)``
    (:func:`paired_verdict` of ``seconds[base]`` and ``seconds[variant]``) is
    :func:`unsettled`, ``extra`` more paired, alternating rounds of the names of every
    such pair (``model_timing.alternate``), appended to ``seconds``; the verdict is then
    taken over all rounds. A verdict that median and quartile agree on is final after
    the first rounds. ``progress`` gets ``"<label> extra round i/extra"`` after each
    round. Returns the names extended, in the order they were first named.

    Pairing stays by round: a name shared by several pairs (one base against several
    variants, or one variant against several bases) gains rounds that only the extended
    names share, and :func:`paired_verdict` pairs a shorter list with the first rounds
    of the longer one, which are its own."""
    from . import model_timing

    if extra <= 0:
        return []
    names: list[str] = []
    for base, variant in pairs:
        if unsettled(*paired_verdict(seconds[base], seconds[variant], min_improvement_bps)[:2],
                     min_improvement_bps):
            names += [n for n in (base, variant) if n not in names]
    if names:
        def on_round(r, order, secs):
            if progress is not None:
                progress(f"{label} extra round {r + 1}/{extra}")

        more = model_timing.alternate(names, extra, measure, on_round)
        for name, secs in more.items():
            seconds[name].extend(secs)
    return names


def _dtype_at(layer, m: int) -> mx.Dtype | None:
    """The dtype of the calls with ``m`` tokens this layer has seen (``None``: none)."""
    for (shape, dtype), decision in layer._decisions.items():
        if decision[0] == m:
            return dtype
    return None


def check_decode(
    model: nn.Module,
    tuner: Tuner | None = None,
    *,
    steps: int = STEPS,
    prompt: int = PROMPT,
    rounds: int = ROUNDS,
    extra_rounds: int | None = None,
    min_improvement_bps: float = MIN_IMPROVEMENT_BPS,
    record: bool = True,
    progress: Callable[[str], None] | None = None,
    batches: Sequence[int] = BATCHES,
) -> DecodeCheck:
    """Keep a tuned M = 1 kernel only where it makes the model's decode faster, and a
    tuned M = B kernel (B in ``batches``) only where it makes the model's batched decode
    of B sequences faster.

    Args:
        model: an mlx-lm model converted with :func:`mlx_w8a8.quantize` (its
            ``mlx_w8a8.Linear`` layers decide through the process-wide tuner).
        tuner: where rewritten entries are recorded (default: the process-wide
            tuner). It should be the tuner the layers decide with.
        steps: decode steps per timed sample (after one untimed first token).
        prompt: prompt tokens before them.
        rounds: paired, alternating rounds (>= 2).
        extra_rounds: rounds added where a verdict is unsettled (the median passes the
            margin, the lower quartile does not: :func:`extend_unsettled`); ``None``:
            ``rounds``; 0: none.
        min_improvement_bps: how much faster than the reference the tuned kernel must
            make decode (basis points) to stay.
        record: write the verdicts into ``tuner``'s writable table.
        progress: called with a short message after each round.
        batches: batch sizes B (powers of two >= 2, M buckets) whose batched decode
            (:func:`mlx_w8a8.tuning.model_timing.batch_decode`: B sequences, one token
            each per step, so every linear sees M = B rows) judges the M = B entries
            the same way; a B whose linears' decisions are all the reference or come
            from another M bucket's entry is skipped untimed. Empty: B = 1 only.

    Returns:
        A :class:`DecodeCheck`.

    Raises:
        ValueError: for bad arguments or a model without ``mlx_w8a8.Linear`` layers.
    """
    from . import model_timing
    from .active import get_tuner

    extra_rounds = rounds if extra_rounds is None else extra_rounds
    if steps < 1 or prompt < 1 or rounds < 2 or extra_rounds < 0:
        raise ValueError(
            f"[{OP}] need steps >= 1, prompt >= 1, rounds >= 2 and extra_rounds >= 0; got "
            f"steps={steps}, prompt={prompt}, rounds={rounds}, extra_rounds={extra_rounds}"
        )
    batches = tuple(batches)
    bad = [b for b in batches
           if isinstance(b, bool) or not isinstance(b, int) or b < 2 or b & (b - 1)]
    if bad:
        raise ValueError(f"[{OP}] batches must be powers of two >= 2 (M buckets), got "
                         f"{list(batches)}")
    check_margin(OP, min_improvement_bps)
    layers = linears.w8a8_linears(model)
    if not layers:
        raise ValueError(f"[{OP}] {type(model).__name__} has no mlx_w8a8.Linear layers "
                         f"(convert it with mlx_w8a8.quantize first)")
    tuner = tuner or get_tuner()
    vocab = model_timing.vocab_size(model, OP)
    tokens = model_timing.prompt_tokens(vocab, prompt)[0]
    loop = model_timing.decode_loop()[1]

    def decode() -> float:
        return model_timing.decode(model, tokens, steps, loop)

    passes: list = []  # each pass's GroupResults, B = 1 first, then by batch size
    all_seconds: dict = {}
    recorded = 0
    checked: list[int] = []  # the batch sizes > 1 whose step was timed
    dtypes: dict[int, mx.Dtype | None] = {}  # id(layer) -> its dtype at M = 1 (B = 1 fills it)
    for m in (1, *sorted(set(batches))):
        if m == 1:
            run, label, prefix = decode, "decode check", ""
        else:
            # B distinct prompts of equal length: the server's batch, one token each per step
            prompts = model_timing.prompt_tokens(vocab, prompt, rows=m)
            bloop = model_timing.batch_decode_loop()[1]

            def run(prompts=prompts, bloop=bloop) -> float:
                return model_timing.batch_decode(model, prompts, steps, bloop)

            label, prefix = f"decode check B = {m}", f"B = {m} "
        results_m, seconds_m, recorded_m = _check_at(
            m, run, layers, dtypes, tuner, rounds, extra_rounds, min_improvement_bps, record,
            progress, label, {"steps": steps, "rounds": rounds,
                              "min_improvement_bps": min_improvement_bps,
                              **({"batch": m} if m > 1 else {})})
        if m > 1 and results_m:
            checked.append(m)
        passes.extend(results_m)
        all_seconds.update({prefix + name: secs for name, secs in seconds_m.items()})
        recorded += recorded_m
    return DecodeCheck(tuple(g for results in passes for g in results), steps, rounds,
                       all_seconds, recorded, tuple(checked))


def _decided_at_own_bucket(tuner: Tuner, problem: Problem, name: str) -> bool:
    """Whether ``name`` is ``problem``'s decision by an entry measured at its own M
    bucket (looked up, or borrowed from a near shape), not one snapped from another M:
    a decision of another bucket is that bucket's check's to judge."""
    hit = tuner.lookup(problem)
    if hit is None:
        hit = tuner.borrow(problem)
    return (hit is not None and hit.choice == name
            and hit.entry["m_bucket"] == shapes.bucket(problem.m))


def _check_at(m: int, run: Callable[[], float], layers, dtypes: dict, tuner: Tuner, rounds: int,
              extra_rounds: int, min_improvement_bps: float, record: bool,
              progress: Callable[[str], None] | None, label: str,
              details: dict) -> tuple[list, dict, int]:
    """The check at ``m`` rows per linear: ``run()`` times the model's decode with
    ``m`` rows per step (B = 1: one sequence; B = ``m``: ``m`` sequences, one token
    each). Returns ``(results of each pass, {variant: seconds}, entries written)``.
    ``dtypes`` maps ``id(layer)`` to the dtype of its M = 1 calls: filled at ``m`` = 1,
    read at ``m`` > 1 (a verdict recorded at M = 1 clears the layers' decisions, and
    with them what they have seen).

    At ``m`` = 1 every group whose decision is not the reference is judged; at ``m`` > 1
    only those decided by an entry of the ``m`` bucket itself, and a bucket without one
    is not timed at all."""
    from . import model_timing

    passes: list = []
    all_seconds: dict = {}
    recorded = 0
    for _ in range(2):
        if m == 1:
            run()  # every layer meets M = 1 and decides
        groups: dict[Problem, list[tuple[str, Any]]] = {}
        tuned: dict[Problem, str] = {}
        reference: dict[Problem, str] = {}
        alone: dict[int, str] = {}  # sibling-launch members: the kernel each runs by itself
        for path, layer in layers:
            # The decode path's dtype: the layers that met M = 1 are the ones a decode
            # step (any batch size) runs.
            if m == 1:
                dtypes[id(layer)] = _dtype_at(layer, 1)
            dtype = dtypes.get(id(layer))
            if layer.kernel is not None or dtype is None:
                continue  # forced by the user, or not on the decode path
            found = layer._group_decision(m, dtype)
            if found is not None:
                # One launch with its siblings, decided by their summed problem's entry:
                # that entry is what is judged and rewritten, and the members' own
                # decisions are what runs if it is.
                candidate, _, _, problem = found
                name = candidate.name
                alone[id(layer)] = registry.decide(layer.problem(m, dtype))[0].name
            else:
                problem = layer.problem(m, dtype)
                name, _ = layer.decision(m, dtype)
            fallback = registry.fallback(problem).name
            if name != fallback and (m == 1 or _decided_at_own_bucket(tuner, problem, name)):
                groups.setdefault(problem, []).append((path, layer))
                tuned[problem], reference[problem] = name, fallback
        if not groups:
            break

        problems = list(groups)
        # Sibling groups this check turned off (each member alone on its own decisions).
        # Hazard: a member is not forced onto its M = B decision, which may be a kernel of
        # few rows (a GEMV): the batched loop also prefills the B prompts together, at
        # M = B x prompt rows, where the member must decide as usual. (Forced onto the
        # reference, as in the whole table's reference variant, it serves every M.)
        off: dict[int, Any] = {}

        def arrange(drop) -> None:
            """``drop``: the group taken off its tuned kernel, ``None`` (none) or
            :data:`EVERY` (every group's layers on the reference, sibling members too)."""
            for p in problems:
                for _, layer in groups[p]:
                    member = id(layer) in alone  # off: the group launch disabled
                    want = (reference[p] if drop is EVERY or (p == drop and not member)
                            else None)
                    if member:
                        group, enabled = layer.siblings, p != drop
                        if enabled != group.enabled:
                            if not enabled:
                                off[id(group)] = group
                            group.enabled = enabled
                            group.reset()
                    if layer.kernel != want:
                        layer.kernel = want

        def time_variants(variants: dict, pairs: list, stage: str) -> dict:
            """Paired, alternating rounds of ``variants`` (name -> ``drop`` of
            :func:`arrange`), more where a pair's verdict is unsettled; progress
            messages name ``stage``."""
            def measure(name: str) -> float:
                arrange(variants[name])
                return run()

            def on_round(r, order, secs):
                if progress is not None:
                    progress(f"{label}, {stage}: round {r + 1}/{rounds}")

            try:
                for name in variants:  # untimed: plans built, kernels compiled
                    measure(name)
                seconds = model_timing.alternate(list(variants), rounds, measure, on_round)
                extend_unsettled(seconds, pairs, extra_rounds, measure, min_improvement_bps,
                                 progress, f"{label}, {stage}:")
            finally:
                for p in problems:
                    for _, layer in groups[p]:
                        if layer.kernel is not None:
                            layer.kernel = None
                for group in off.values():
                    if not group.enabled:
                        group.enabled = True
                        group.reset()
            return seconds

        def result(p, pair, seconds, whole=False) -> GroupResult:
            ratio, low, kept = paired_verdict(*(seconds[n] for n in pair), min_improvement_bps)
            return GroupResult(p, tuple(path for path, _ in groups[p]), tuned[p], reference[p],
                               ratio, low, kept, min(len(seconds[n]) for n in pair), whole)

        # First the decisions as a whole, against every one of them on the reference.
        seconds = time_variants(dict(zip(WHOLE, (EVERY, None))), [WHOLE], "as a whole")
        results = [result(p, WHOLE, seconds, whole=True) for p in problems]
        judged = "whole"
        if not results[0].kept:
            # Then each group, taken off the tuned model alone.
            variants = {"tuned": None,
                        **{f"without group {i}": p for i, p in enumerate(problems)}}
            pairs = [(f"without group {i}", "tuned") for i in range(len(problems))]
            seconds.update(time_variants(variants, pairs, "each group"))
            results = [result(p, pair, seconds) for p, pair in zip(problems, pairs)]
            judged = "tuned"
        if record:
            recorded += record_verdicts(tuner, results, "decode_check",
                                        {**details, "judged_in": judged}, OP)
        suffix = "" if not passes else f" (pass {len(passes) + 1})"
        passes.append(results)
        all_seconds.update({name + suffix: secs for name, secs in seconds.items()})
        # A sibling launch replaced leaves its members on their own decisions; where one of
        # those is not the reference it was not judged here: one more pass judges it.
        unjudged = [layer for g in results if not g.kept for _, layer in groups[g.problem]
                    if alone.get(id(layer), g.reference) != g.reference]
        if not (record and unjudged):
            break
    return passes, all_seconds, recorded


def record_verdicts(tuner: Tuner, results, key: str, details: dict, op: str = OP) -> int:
    """Write each group's verdict (a :class:`GroupResult`) into the entry of its M bucket
    that decided it, under ``key`` with ``details`` and the rounds its verdict rests
    on; a group whose tuned kernel was not kept gets the reference as its choice.
    Returns the entries written."""
    # Every group's deciding entry first: a rewritten entry must not change what the
    # groups borrowing from it are matched against.
    hits = []
    for g in results:
        hit = tuner.lookup(g.problem)
        borrowed = hit is None
        hits.append((g, tuner.borrow(g.problem) if borrowed else hit, borrowed))
    count = 0
    for g, hit, borrowed in hits:
        if hit is None or hit.choice != g.tuned:
            log.info("[%s] %s: no table entry chose %r; nothing to rewrite", op,
                     g.problem, g.tuned)
            continue
        if shapes.bucket(g.problem.m) != hit.entry["m_bucket"]:
            log.info("[%s] %s: decided by the M = %s entry; not rewritten", op, g.problem,
                     hit.entry["m_bucket"])
            continue
        entry = dict(hit.entry)
        if borrowed:  # an entry of this shape's own, carrying the verdict, no timings
            p = g.problem
            entry.update(
                n=p.n, k=p.k, m=p.m, has_bias=p.has_bias,
                borrowed_from={"n": hit.entry["n"], "k": hit.entry["k"]},
                candidates={
                    name: {key: info[key] for key in ("backend", "digest", "status")
                           if key in info}
                    for name, info in hit.entry["candidates"].items()
                },
            )
        entry[key] = {
            "tuned": g.tuned, "reference": g.reference, "ratio": round(g.ratio, 4),
            "p25": round(g.low, 4), "kept": g.kept, **details, "rounds": g.rounds,
            "checked_at": _now(),
        }
        if not g.kept:
            entry["choice"] = g.reference
            entry["speedup"] = 1.0
        claim = tuner.claim(g.problem)
        if claim is None:
            log.warning("[%s] %s is being measured by another tuner; verdict not recorded",
                        op, g.problem)
            continue
        tuner.record(claim, entry)
        count += 1
    return count
