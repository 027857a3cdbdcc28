"""The kernel registry: every implementation of an op is a ``Candidate``.

Ops in :mod:`mlx_w8a8.ops` never call a kernel directly. They describe the work as a
:class:`Problem`, ask :func:`choose` for a candidate and call its ``run``. Backends
(the pure-MLX ``exact`` and ``mlx_qmm``, CUDA, Metal) register candidates at import; a backend that is missing on
this machine registers nothing, so callers see fewer candidates and nothing breaks.

A candidate implements one op; names are unique per op (``exact``, the W8A8 math of
``docs/numerics.md`` in MLX ops, exists for each).
Run signatures, by ``Problem.op``:

- ``"linear"``: ``run(x, weight, bias) -> y`` with ``x`` ``[M, K]`` float16/bfloat16/
  float32, ``weight`` a :class:`mlx_w8a8.weight.QuantizedWeight` of shape ``[N, K]``,
  ``bias`` ``[N]`` or ``None``; ``y`` is ``[M, N]`` in ``x.dtype``.
- ``"int8_matmul"``: ``run(a, b) -> c`` with ``a`` ``[M, K]`` int8, ``b`` ``[N, K]``
  int8; ``c = a @ b.T`` as ``[M, N]`` int32, bit-exact.
- ``"quantize_activation"``: ``run(x, group_size) -> (q, scales, row_sums)`` with
  ``q`` ``[M, K]`` int8, ``scales`` ``[M, 1]`` float32 and ``row_sums`` ``[M, K //
  group_size]`` int32 (or ``None`` when ``group_size`` is ``None``).
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any, Callable, Hashable, Iterable

import attrs
import mlx.core as mx

from ..weight import GROUPED4, LINEAR_MAX_K, MAX_K

OPS = ("linear", "int8_matmul", "quantize_activation")
WEIGHT_FORMATS = ("per_channel", "grouped", GROUPED4, "int8")
# How a W8A8 (W4A8) linear scales its int8 activations: one scale per token, or one per
# token and weight group (docs/numerics.md, "Activation groups"; grouped weights only).
ACT_SCALES = ("token", "group")


@attrs.frozen
class Problem:
    """One unit of work, as the tuner keys it.

    Args:
        op: one of ``OPS``.
        m: rows of the activation (tokens), ``M``.
        n: output features, ``N`` (``0`` for ``quantize_activation``).
        k: input features, ``K``.
        dtype: dtype name of the activation (``"float16"``, ``"bfloat16"``,
            ``"float32"``; ``"int8"`` for ``int8_matmul``).
        weight_format: ``"per_channel"`` (symmetric int8 per output channel),
            ``"grouped"`` (general affine 8-bit), ``"grouped4"`` (MLX's affine 4-bit)
            or ``"int8"`` (raw int8 operands).
        group_size: the weight's group size, or ``None`` where it has none.
        has_bias: whether a bias vector is added in the epilogue.
        act_scales: ``"token"`` (one int8 scale per token) or ``"group"`` (one per token
            and weight group: ``grouped`` and ``grouped4`` weights only). Candidates
            that are not W8A8 (``mlx_qmm``) ignore it; a W8A8 candidate runs a problem
            only if it lists the value in ``Candidate.act_scales``.
    """

    op: str = attrs.field(validator=attrs.validators.in_(OPS))
    m: int
    n: int
    k: int
    dtype: str
    weight_format: str = attrs.field(validator=attrs.validators.in_(WEIGHT_FORMATS))
    group_size: int | None = None
    has_bias: bool = False
    act_scales: str = attrs.field(default="token", validator=attrs.validators.in_(ACT_SCALES))

    @property
    def bits(self) -> int:
        """Bits per stored weight code: 4 for MLX's 4-bit affine weights, else 8."""
        return 4 if self.weight_format == GROUPED4 else 8

    def __attrs_post_init__(self):
        if self.act_scales == "group" and self.weight_format not in ("grouped", GROUPED4):
            raise ValueError(
                f"[mlx_w8a8.Problem] act_scales='group' needs group-wise weights "
                f"(weight_format 'grouped' or '{GROUPED4}'), got weight_format "
                f"{self.weight_format!r}"
            )


@attrs.frozen(eq=False)
class Candidate:
    """One implementation of one op.

    Args:
        name: unique name, e.g. ``"mlx_qmm"``, ``"exact"``, ``"cuda_w8a8_gemm"``.
        backend: where it runs: ``"any"`` (pure MLX), ``"cuda"`` or ``"metal"``.
        op: the ``Problem.op`` it implements.
        run: the implementation (signature per op: module docstring).
        supports: ``supports(problem) -> bool``; shapes, formats and dtypes it takes.
            It must be cheap and must not touch device memory.
        can_implement: optional: ``can_implement(problem) -> (ok, reason)``, the verdict
            of ``supports`` with the reason a user reads where it refuses (which
            dimension, dtype, format, bound or capability, and what is valid);
            :func:`refusal` reports it.
        digest: a short digest of what the candidate executes (the source of its
            Python functions, its kernel text and launch parameters; see
            :func:`mlx_w8a8.kernels.sources.code_digest`) so a tuning table can tell
            when a measurement is stale. An empty digest makes every entry that
            measured the candidate stale.
        available: ``available() -> bool``; whether the backend can run here now
            (checked when a decision is made, never per call). A candidate that also
            needs a backend capability is declared with :func:`needs`; use
            :func:`available` for both.
        stages: ``linear`` only, optional: ``stages(problem) -> (act_key, quantize,
            apply)`` or ``None``. Splits ``run`` into ``quantize(x) -> acts`` (the
            activation quantization) and ``apply(acts, weight, bias, out_dtype) -> y``
            so layers fed the same ``x`` (q/k/v, gate/up) quantize it once: ``act_key``
            (hashable) names the activation format, and candidates whose keys are equal
            must produce interchangeable ``acts``. ``run(x, w, b)`` must equal
            ``apply(quantize(x), w, b, x.dtype)``.
        bind: ``linear`` only, optional: ``bind(layer, problem) -> f`` with ``f(x) ->
            y`` for ``x`` ``[..., K]`` of ``problem``'s dtype: the whole call of an
            ``mlx_w8a8.Linear`` as one closure, reading the layer's arrays at call time
            (they may be replaced) and returning what ``run`` would. For kernels that
            can be called as cheaply as MLX's own layers (no reshape, no weight view).
        bind_stages: ``linear`` only, optional: ``bind_stages(problem, weight, bias) ->
            (act_key, quantize, apply)``: ``stages`` (or, where ``stages(problem)`` is
            ``None``, ``run``) for one problem and one weight, with everything that does
            not depend on the activations (kernel objects, weight inputs, float32 bias,
            templates, output shapes, grids) computed once. ``quantize(x) -> acts`` and
            ``apply(acts) -> y`` make the launches ``stages``' ``quantize(x)`` and
            ``apply(acts, weight, bias, dtype)`` make, ``act_key`` is ``stages``' key; with
            no stages ``act_key`` and ``quantize`` are ``None`` and ``apply(x) -> y`` makes
            the launches of ``run(x, weight, bias)``. An optional fourth argument
            ``lead`` (a tuple whose product is ``problem.m``) makes them take ``x``
            ``[*lead, K]`` and return ``[*lead, N]`` (no reshape in the layer's call);
            without it ``x`` is ``[problem.m, problem.k]``, of ``problem.dtype`` either
            way. ``mlx_w8a8.Linear`` binds once per decision, input shape and weight (it
            binds again when its arrays are replaced).
        bind_group: ``linear`` only, optional: ``bind_group(problem, members, lead) ->
            (act_key, quantize, apply)``: one launch computing several layers fed the
            same ``x`` (``mlx_w8a8.Linear`` siblings such as q/k/v or gate/up).
            ``members`` is a list of ``(weight, bias)``, ``problem`` their summed
            problem (``N = sum N_g``), ``apply(acts)`` returns one ``[*lead, N_g]`` array
            per member, each equal to what ``bind_stages`` would return for it alone.
        variant: optional: ``variant(problem) -> key`` (hashable): what the candidate
            compiles for ``problem`` (kernel bodies, template arguments, tile), so that
            two problems with equal keys launch the same compiled kernels and a problem
            with a key not seen before may compile some (:func:`mlx_w8a8.warm_up` calls
            a layer once per key). A sibling launch (``bind_group``) on the members'
            summed problem compiles what the key of that problem names, in the
            multi-weight form for the number of members. Things fixed for a layer that a
            problem does not hold (the scales' dtype) may be left out. ``None``: the
            name alone identifies what it runs (candidates made of MLX's own ops).
        w8a8: ``linear`` only: whether ``run`` computes the W8A8 math of
            ``docs/numerics.md`` (per-token int8 activations). The tuner's gate checks
            such candidates against ``exact`` within the float32-epilogue bound;
            ``mlx_qmm`` (W8A16, ``False``) is only held to the user-facing tolerance.
        act_scales: ``linear`` W8A8 candidates: the ``Problem.act_scales`` values
            ``run`` computes (default: per-token scales only). Checked centrally
            (:meth:`handles`, :func:`refusal`), so a kernel never meets activation
            scaling it was not written for.
        bound_form: ``linear`` W8A8 candidates: which error bound of
            ``docs/numerics.md`` their float32 arithmetic keeps: ``"epilogue"`` (the
            ``2G + 4`` roundings of the group terms) or ``"subnormal"`` (the subnormal
            promotion's, over its unsigned terms); the gate holds each to its own
            (``tuning.gate.w8a8_bound``).
    """

    name: str
    backend: str
    op: str = attrs.field(validator=attrs.validators.in_(OPS))
    run: Callable[..., Any]
    supports: Callable[[Problem], bool] = lambda problem: True
    can_implement: Callable[[Problem], tuple[bool, str]] | None = None
    digest: str = ""
    available: Callable[[], bool] = lambda: True
    stages: Callable[[Problem], Any] | None = None
    bind: Callable[[Any, Problem], Callable] | None = None
    bind_stages: Callable[..., tuple] | None = None
    bind_group: Callable[..., tuple] | None = None
    variant: Callable[[Problem], Hashable] | None = None
    w8a8: bool = True
    act_scales: tuple[str, ...] = ("token",)
    bound_form: str = attrs.field(default="epilogue",
                                  validator=attrs.validators.in_(("epilogue", "subnormal")))

    def handles(self, problem: Problem) -> bool:
        """True when this candidate can run ``problem`` on this machine now (a W8A8
        candidate never where its integer sums cannot be exact: :func:`inexact`)."""
        if problem.op != self.op:
            return False
        if self.w8a8 and (inexact(problem) is not None
                          or problem.act_scales not in self.act_scales):
            return False
        try:
            return available(self) and bool(self.supports(problem))
        except Exception:  # a broken capability probe must not break dispatch
            return False


def refusal(candidate: Candidate, problem: Problem) -> str | None:
    """Why ``candidate`` cannot run ``problem`` here (``None`` where it can,
    :meth:`Candidate.handles`): another op, sums that cannot be exact
    (:func:`inexact`), the backend or a capability it needs off
    (:func:`unavailable_reason`), or its own requirements (``can_implement``'s reason)."""
    if problem.op != candidate.op:
        return f"it implements {candidate.op}, not {problem.op}"
    if candidate.w8a8 and (why := inexact(problem)) is not None:
        return why
    if candidate.w8a8 and problem.act_scales not in candidate.act_scales:
        return (f"it scales activations per {' / '.join(candidate.act_scales)} only, not "
                f"act_scales={problem.act_scales!r}")
    if (why := unavailable_reason(candidate)) is not None:
        return why
    try:
        if candidate.can_implement is not None:
            ok, why = candidate.can_implement(problem)
            return None if ok else why
        return None if candidate.supports(problem) else "its supports() refuses the problem"
    except Exception as error:  # a broken capability probe must not break dispatch
        return f"its capability check failed ({type(error).__name__}: {error})"


def inexact(problem: Problem) -> str | None:
    """Why the W8A8 math of ``docs/numerics.md`` cannot be exact for ``problem`` (its
    int32 sums could overflow), or ``None`` where it can. Checked by
    :meth:`Candidate.handles` for every W8A8 candidate, whatever its backend, so a
    default decision falls to ``mlx_qmm`` and a forced W8A8 kernel is refused.

    - ``int8_matmul``: ``|a * b| <= 2^14``, exact for ``K < 2^17`` (``weight.MAX_K``).
    - ``linear``, per-channel: ``|q_a| <= 127``, ``|w| <= 128``, one int32 sum over K:
      exact for ``K <= 132104`` (``weight.LINEAR_MAX_K``).
    - ``linear``, grouped: one int32 sum per group (``|P| <= 127 * 128 * group_size``),
      promoted to float32: no bound on K.
    - ``linear``, grouped4: one sum per group of activation codes times unsigned 4-bit
      codes (``|P| <= 127 * 15 * group_size <= 243840``), promoted to float32: no
      bound on K.
    - ``quantize_activation``: no integer sums over K.

    Kernels with tighter sums check their own bound in ``supports`` (the CUDA GEMMs on
    unsigned weight codes: ``K <= 66311``, ``kernels.cuda.launch.U8_MAX_K``).
    """
    if problem.op == "int8_matmul" and problem.k >= MAX_K:
        return (f"K = {problem.k} is too large for an exact int32 product of int8 "
                f"operands: it needs K < 2^17 = {MAX_K} (|a * b| <= 2^14)")
    if problem.op == "linear" and problem.weight_format == "per_channel" and (
        problem.k > LINEAR_MAX_K
    ):
        return (f"K = {problem.k} is too large for an exact per-channel W8A8 product: "
                f"the int32 sum of K products of activation codes (|q| <= 127) and weight "
                f"codes (|w| <= 128) is exact only for K <= {LINEAR_MAX_K} "
                f"(127 * 128 * K <= 2^31 - 1); kernel='mlx_qmm' runs any K")
    return None


# Backend capabilities (``mlx_w8a8.kernels.capabilities()``: each backend module's
# ``status()``) that candidates need beyond their ``available()``: a capability that is
# off makes them unavailable everywhere (decisions, tuning races, ``available_kernels``).
# Each backend declares its candidates' needs with :func:`needs` where it registers them.
_NEEDS: dict[str, tuple[str, ...]] = {}


def _probe(module: str, function: str) -> Callable[[], bool]:
    """``module.function()`` of a backend module, looked up when called (a backend
    that did not import has nothing on)."""
    def on() -> bool:
        found = sys.modules.get(f"{__package__}.{module}")
        return found is not None and bool(getattr(found, function)())
    return on


# A capability's own probe, where its backend's ``status()`` reports it together with
# the backend's presence (``cuda_tma`` is off in ``status()`` without a CUDA GPU): the
# candidate's ``available()`` answers for the backend, the probe for the capability
# alone, the same probes the candidates' ``supports()`` use. Capabilities without one
# are read from ``capabilities()``.
_PROBES: dict[str, Callable[[], bool]] = {
    "cuda_sm90": _probe("cuda.launch", "is_sm90"),
    "cuda_tma": _probe("tensormap", "available"),
}


def needs(name: str, *capabilities: str) -> None:
    """Declare that candidate ``name`` (of any op) runs only where every one of
    ``capabilities`` is on (no arguments: it needs none)."""
    with _lock:
        if capabilities:
            _NEEDS[name] = tuple(capabilities)
        else:
            _NEEDS.pop(name, None)
    invalidate()


def unavailable_reason(candidate: "Candidate") -> str | None:
    """Why ``candidate`` cannot run here (``None``: it can): its backend says no
    (``Candidate.available()``), or a capability it needs is off (with the reason its
    backend's ``status()`` gives)."""
    try:
        if not candidate.available():
            return f"backend {candidate.backend!r} not available here"
    except Exception as error:  # a broken probe means not available
        return f"its availability probe failed ({type(error).__name__}: {error})"
    wanted = _NEEDS.get(candidate.name)
    if not wanted:
        return None
    capabilities = _capabilities  # installed by the kernels package (set_capabilities)
    try:
        off = [cap for cap in wanted
               if not (_PROBES[cap]() if cap in _PROBES else capabilities().get(cap, (False,))[0])]
        if not off:
            return None
        reports = capabilities()
    except Exception as error:
        return f"its capabilities cannot be read ({type(error).__name__}: {error})"
    cap = off[0]
    return f"{cap} is off ({reports.get(cap, (False, 'not reported by any backend'))[1]})"


def available(candidate: "Candidate") -> bool:
    """Whether ``candidate`` can run on this machine now: ``Candidate.available()`` and
    every capability it needs on (:func:`needs`). Checked when a decision is made."""
    return unavailable_reason(candidate) is None


_lock = threading.Lock()
_candidates: dict[tuple[str, str], Candidate] = {}
# The exact W8A8 math in MLX ops (registered for every op by ``kernels.reference``).
EXACT = "exact"
# The exact W4A8 math and ``mx.quantized_matmul`` at 4 bits, for ``linear`` on the
# ``"grouped4"`` format (``kernels.reference``): ``exact`` and ``mlx_qmm`` run 8-bit
# codes only (their code is what the shipped tuning tables' digests name).
EXACT_W4A8 = "exact_w4a8"
QMM4 = "mlx_qmm4"
# The exact math with activation groups (``Problem.act_scales == "group"``), 8- and 4-bit
# grouped weights: a candidate of its own, so that ``exact``'s and ``exact_w4a8``'s
# digests (recorded in the shipped tables) stay those of the code they measured.
EXACT_ACT_GROUPS = "exact_act_groups"
# Per op, the candidate used when nothing else decides (no tuning-table hit).
_FALLBACK = {"linear": "mlx_qmm", "int8_matmul": EXACT, "quantize_activation": EXACT}
# ... and per (op, weight format) where the format has its own.
_FALLBACK_BY_FORMAT = {("linear", GROUPED4): QMM4}
_EXACT_BY_FORMAT = {("linear", GROUPED4): EXACT_W4A8}


def fallback_name(problem: Problem) -> str:
    """The name of ``problem``'s reference and fallback candidate (``mlx_qmm`` for an
    8-bit ``linear``, ``mlx_qmm4`` for a 4-bit one, ``exact`` for the other ops)."""
    return _FALLBACK_BY_FORMAT.get((problem.op, problem.weight_format), _FALLBACK[problem.op])


def exact_name(problem: Problem) -> str:
    """The name of the candidate computing ``problem``'s exact W8A8 (or W4A8) math of
    ``docs/numerics.md``: ``exact``, or ``exact_w4a8`` for the ``"grouped4"`` format;
    ``exact_act_groups`` for either grouped format with ``act_scales="group"``."""
    if problem.op == "linear" and problem.act_scales == "group":
        return EXACT_ACT_GROUPS
    return _EXACT_BY_FORMAT.get((problem.op, problem.weight_format), EXACT)


# Invalidation is pushed: whenever a decision made earlier may no longer hold (a
# candidate registered or removed, a chooser installed, tables reloaded or re-pointed, a
# measurement recorded), :func:`invalidate` clears the decisions kept here and tells every
# watcher (the plan caches of ``mlx_w8a8.plans``) to forget its own, so no hot path checks
# anything per call. ``generation`` counts invalidations: a cache reads it before deciding
# and does not keep what it decided if it moved meanwhile.
generation = 0
# By id: the holders (nn.Module is a dict) are not hashable; an entry goes with its holder.
_watchers: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def watch(holder: Any) -> None:
    """Call ``holder._forget()`` on every :func:`invalidate` (held weakly)."""
    with _lock:
        _watchers[id(holder)] = holder


def invalidate() -> None:
    """Mark every cached kernel decision stale (they are re-made on next use)."""
    global generation
    with _lock:
        generation += 1
        _decided.clear()
        holders = list(_watchers.values())
    for holder in holders:
        holder._forget()


def register(candidate: Candidate) -> Candidate:
    """Add ``candidate``; a second registration of (op, name) replaces the first."""
    with _lock:
        _candidates[(candidate.op, candidate.name)] = candidate
    invalidate()
    return candidate


def unregister(op: str, name: str) -> None:
    """Remove candidate ``name`` of ``op`` (no error if absent). Used by tests."""
    with _lock:
        _candidates.pop((op, name), None)
    invalidate()


def get(op: str, name: str) -> Candidate:
    """The candidate called ``name`` that implements ``op``.

    Raises:
        ValueError: if there is none.
    """
    candidate = _candidates.get((op, name))
    if candidate is None:
        with _lock:
            known = sorted(n for o, n in _candidates if o == op)
        raise ValueError(
            f"[mlx_w8a8.{op}] unknown kernel {name!r}; kernels registered for {op}: {known}"
        )
    return candidate


def find(op: str, name: str) -> Candidate | None:
    """The candidate called ``name`` that implements ``op``, or ``None``."""
    return _candidates.get((op, name))


def all_candidates() -> list[Candidate]:
    """Every registered candidate, available here or not, in registration order."""
    with _lock:
        return list(_candidates.values())


def candidates(problem: Problem) -> list[Candidate]:
    """The candidates that can run ``problem`` here, the fallback first."""
    found = [c for c in all_candidates() if c.handles(problem)]
    fallback = fallback_name(problem)
    return sorted(found, key=lambda c: c.name != fallback)


def fallback(problem: Problem) -> Candidate:
    """The candidate used when nothing has been measured: the tuner's reference. Where
    that candidate cannot run ``problem`` here (``mx.quantized_matmul`` where MLX's own
    kernel is known wrong, see ``reference.qmm_supports``), the exact kernel."""
    candidate = get(problem.op, fallback_name(problem))
    return candidate if candidate.handles(problem) else get(problem.op, exact_name(problem))


# The tuner's hook. ``choose`` asks the installed chooser; with none installed (or
# when it fails) the fallback runs. Tuning never breaks inference.
# A chooser returns ``None`` (no opinion), a ``Candidate``, or ``(Candidate, source)``
# where ``source`` says where the decision came from (``"table"``, ``"borrowed"``,
# ``"prior"``, ...), shown by ``repr(layer)`` and ``mlx_w8a8.quantize``'s summary.
Chooser = Callable[[Problem, list[Candidate]], Any]
_chooser: Chooser | None = None


def set_chooser(chooser: Chooser | None) -> Chooser | None:
    """Install ``chooser(problem, candidates)``; returns the old one. Its answer for a
    problem is kept (:func:`decide`) until :func:`invalidate`: a chooser whose answers
    change (a table reloaded, a measurement recorded) calls it then, as the tuner does."""
    global _chooser
    previous, _chooser = _chooser, chooser
    invalidate()
    return previous


# (problem, forced kernel, device type) -> (candidate, source): what :func:`decide`
# returned, until :func:`invalidate` clears it. Every layer
# of a model meets a new prompt length with the same few problems (one per shape), so
# all but the first layer per problem take the decision from here instead of filtering
# every candidate and asking the chooser again (measured on an NVIDIA H200's host: 29
# decisions per 4-layer prefill at a new length cost 3 of its 12 ms of graph build,
# 2026-12-02).
_decided: dict = {}
_MAX_DECIDED = 4096


def decide(problem: Problem, kernel: str | None = None) -> tuple[Candidate, str]:
    """Pick the candidate that runs ``problem`` and say why.

    Args:
        problem: the work to do.
        kernel: a candidate name to force, or ``None`` to let the tuner decide.

    Returns:
        ``(candidate, source)``: ``source`` is ``"forced"``, ``"fallback"`` or what the
        chooser said (``"table"``, ``"borrowed"``, ``"prior"``, ``"measured"``, ...).

    Raises:
        ValueError: if ``kernel`` is unknown or cannot run ``problem`` here.
    """
    if _lookup_hook is not None:
        _lookup_hook(problem)
    key = (problem, kernel, mx.default_device().type)
    hit = _decided.get(key)
    if hit is not None:
        return hit
    stamp = generation  # read first: an invalidation while deciding keeps nothing
    decision, keep = _decide(problem, kernel)
    if keep:
        with _lock:  # invalidate() clears under this lock: a stale decision is never kept
            if generation == stamp:
                if len(_decided) >= _MAX_DECIDED:
                    _decided.clear()
                _decided[key] = decision
    return decision


def _decide(problem: Problem, kernel: str | None) -> tuple[tuple[Candidate, str], bool]:
    """:func:`decide` uncached: ``((candidate, source), keep)``, ``keep`` false where
    the chooser failed (the fallback then runs this time only)."""
    if kernel is not None:
        candidate = get(problem.op, kernel)
        if not candidate.handles(problem):
            why = refusal(candidate, problem)
            raise ValueError(
                f"[mlx_w8a8.{problem.op}] kernel {kernel!r} cannot run {problem.op} for M={problem.m}, "
                f"N={problem.n}, K={problem.k}, dtype={problem.dtype}, "
                f"format={problem.weight_format} on this machine"
                + (f": {why}" if why else "")
                + f"; available: {names(candidates(problem))}"
            )
        return (candidate, "forced"), True
    if _chooser is not None:
        try:
            picked = _chooser(problem, candidates(problem))
        except Exception:  # the tuner logs its own failures; inference goes on
            return (fallback(problem), "fallback"), False
        if isinstance(picked, tuple):
            return tuple(picked), True
        if picked is not None:
            return (picked, "chooser"), True
    return (fallback(problem), "fallback"), True


# Called with the problem on every ``decide`` when set (``kernels`` logs unavailable
# backends at debug level through it); ``None`` costs nothing.
_lookup_hook: Callable[[Problem], None] | None = None


def _no_capabilities() -> dict[str, tuple[bool, str]]:
    return {}


# The backends' capability reports (``mlx_w8a8.kernels.capabilities``), installed by the
# kernels package when it has loaded its backends: the package imports this module, so
# this module does not import it.
_capabilities: Callable[[], dict[str, tuple[bool, str]]] = _no_capabilities


def set_capabilities(report: Callable[[], dict[str, tuple[bool, str]]]) -> None:
    """Install the function that reports every backend's capabilities (``{name: (on,
    why)}``), which :func:`unavailable_reason` reads for the capabilities candidates
    need (:func:`needs`)."""
    global _capabilities
    _capabilities = report
    invalidate()


def set_lookup_hook(hook: Callable[[Problem], None] | None) -> None:
    """Install ``hook(problem)``, called at the start of every :func:`decide`."""
    global _lookup_hook
    _lookup_hook = hook


def choose(problem: Problem, kernel: str | None = None) -> Candidate:
    """The candidate that runs ``problem`` (:func:`decide` without the reason)."""
    return decide(problem, kernel)[0]


def layer_run(candidate: Candidate, problem: Problem) -> Callable[..., Any]:
    """``run(x, w, b)`` as an ``mlx_w8a8.Linear`` runs ``candidate`` on ``problem``:
    through its bound launches (``Candidate.bind_stages``, prepared once per weight and
    bias) where it has them, else ``candidate.run``. What the tuner and the bench time,
    so they charge the host cost a layer pays, not that of building every launch from
    scratch (about 4x the Python per call for the CUDA GEMMs)."""
    if candidate.bind_stages is None or problem.op != "linear":
        return candidate.run
    bound: dict[tuple[int, int], Callable] = {}

    def run(x, w, b):
        key = (id(w), id(b))  # the caller keeps w and b alive while it runs
        f = bound.get(key)
        if f is None:
            f = bound[key] = bound_call(candidate, problem, w, b)
        return f(x)

    return run


def bound_call(candidate: Candidate, problem: Problem, w, b) -> Callable[[Any], Any]:
    """``f(x2) -> y`` for ``[M, K]`` ``x2``: ``candidate``'s launches bound to ``w`` and
    ``b`` (``Candidate.bind_stages``; quantize then apply as one call
    (:func:`fuse_stages`), or apply alone)."""
    _, quantize, apply = candidate.bind_stages(problem, w, b)
    return apply if quantize is None else fuse_stages(quantize, apply)


def fuse_stages(quantize: Callable, apply: Callable, activations: bool = False) -> Callable:
    """``f(x) -> apply(acts)`` with ``acts = quantize(x)``, as one ``mx.compile`` call,
    for the bound stages of ``Candidate.bind_stages`` / ``bind_group``; with
    ``activations``, ``f(x) -> (apply(acts), acts)`` (for the sibling memo).

    Each stage alone already replays its traced launch (``cuda.launch.LaunchSpec.bound``),
    but MLX's compiled-function call has a fixed cost (argument trees, cache lookup,
    output tree) of the order of the launch it saves; one call for both launches saves
    about 5 us of Python per linear on an NVIDIA H200 (``bench/host_split.py`` arms
    ``w8a8`` / ``w8a8c``, 2026-12-01). Each output array costs too (about 0.4 us each
    on a 2-core CPU), so the activations come back only when asked for. Only for bound
    stages made of MLX custom kernels: ``mx.compile`` would fuse (and so round
    differently) a stage made of MLX's own elementwise ops.
    """
    if activations:
        def both(x):
            acts = quantize(x)
            return apply(acts), acts
        return mx.compile(both)
    return mx.compile(lambda x: apply(quantize(x)))


def names(found: Iterable[Candidate]) -> list[str]:
    return [c.name for c in found]
