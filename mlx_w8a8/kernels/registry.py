"""The kernel registry: every implementation of an op is a ``Candidate``.

Ops in :mod:`mlx_w8a8.ops` never call a kernel directly. They describe the work as a
:class:`Problem`, ask :func:`choose` for a candidate and call its ``run``. Backends
(reference, CUDA, Metal) register candidates at import; a backend that is missing on
this machine registers nothing, so callers see fewer candidates and nothing breaks.

A candidate implements one op; names are unique per op (``reference`` exists for each).
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

import threading
from typing import Any, Callable, Iterable

import attrs

OPS = ("linear", "int8_matmul", "quantize_activation")
WEIGHT_FORMATS = ("per_channel", "grouped", "int8")


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
            ``"grouped"`` (general affine 8-bit) or ``"int8"`` (raw int8 operands).
        group_size: the weight's group size, or ``None`` where it has none.
        has_bias: whether a bias vector is added in the epilogue.
    """

    op: str = attrs.field(validator=attrs.validators.in_(OPS))
    m: int
    n: int
    k: int
    dtype: str
    weight_format: str = attrs.field(validator=attrs.validators.in_(WEIGHT_FORMATS))
    group_size: int | None = None
    has_bias: bool = False


@attrs.frozen(eq=False)
class Candidate:
    """One implementation of one op.

    Args:
        name: unique name, e.g. ``"mlx_qmm"``, ``"reference"``, ``"cuda_w8a8_gemm"``.
        backend: where it runs: ``"any"`` (pure MLX), ``"cuda"`` or ``"metal"``.
        op: the ``Problem.op`` it implements.
        run: the implementation (signature per op: module docstring).
        supports: ``supports(problem) -> bool``; shapes, formats and dtypes it takes.
            It must be cheap and must not touch device memory.
        digest: a short digest of the candidate's source (kernel text, launch
            parameters) so a tuning table can tell when a measurement is stale.
        available: ``available() -> bool``; whether the backend can run here now
            (checked when a decision is made, never per call).
        stages: ``linear`` only, optional: ``stages(problem) -> (act_key, quantize,
            apply)`` or ``None``. Splits ``run`` into ``quantize(x) -> acts`` (the
            activation quantization) and ``apply(acts, weight, bias, out_dtype) -> y``
            so layers fed the same ``x`` (q/k/v, gate/up) quantize it once: ``act_key``
            (hashable) names the activation format, and candidates whose keys are equal
            must produce interchangeable ``acts``. ``run(x, w, b)`` must equal
            ``apply(quantize(x), w, b, x.dtype)``.
    """

    name: str
    backend: str
    op: str = attrs.field(validator=attrs.validators.in_(OPS))
    run: Callable[..., Any]
    supports: Callable[[Problem], bool] = lambda problem: True
    digest: str = ""
    available: Callable[[], bool] = lambda: True
    stages: Callable[[Problem], Any] | None = None

    def handles(self, problem: Problem) -> bool:
        """True when this candidate can run ``problem`` on this machine now."""
        if problem.op != self.op:
            return False
        try:
            return bool(self.available()) and bool(self.supports(problem))
        except Exception:  # a broken capability probe must not break dispatch
            return False


_lock = threading.Lock()
_candidates: dict[tuple[str, str], Candidate] = {}
# Per op, the candidate used when nothing else decides (no tuning-table hit).
_FALLBACK = {"linear": "mlx_qmm", "int8_matmul": "reference", "quantize_activation": "reference"}


def register(candidate: Candidate) -> Candidate:
    """Add ``candidate``; a second registration of (op, name) replaces the first."""
    with _lock:
        _candidates[(candidate.op, candidate.name)] = candidate
    return candidate


def unregister(op: str, name: str) -> None:
    """Remove candidate ``name`` of ``op`` (no error if absent). Used by tests."""
    with _lock:
        _candidates.pop((op, name), None)


def get(op: str, name: str) -> Candidate:
    """The candidate called ``name`` that implements ``op``.

    Raises:
        ValueError: if there is none.
    """
    with _lock:
        candidate = _candidates.get((op, name))
        known = sorted(n for o, n in _candidates if o == op)
    if candidate is None:
        raise ValueError(
            f"[mlx_w8a8.{op}] unknown kernel {name!r}; kernels registered for {op}: {known}"
        )
    return candidate


def all_candidates() -> list[Candidate]:
    """Every registered candidate, available here or not, in registration order."""
    with _lock:
        return list(_candidates.values())


def candidates(problem: Problem) -> list[Candidate]:
    """The candidates that can run ``problem`` here, the fallback first."""
    found = [c for c in all_candidates() if c.handles(problem)]
    fallback = _FALLBACK[problem.op]
    return sorted(found, key=lambda c: c.name != fallback)


def fallback(problem: Problem) -> Candidate:
    """The candidate used when nothing has been measured: the tuner's reference."""
    return get(problem.op, _FALLBACK[problem.op])


# The tuner's hook. ``choose`` asks the installed chooser; with none installed (or
# when it fails) the fallback runs. Tuning never breaks inference.
Chooser = Callable[[Problem, list[Candidate]], "Candidate | None"]
_chooser: Chooser | None = None


def set_chooser(chooser: Chooser | None) -> Chooser | None:
    """Install ``chooser(problem, candidates) -> Candidate | None``; returns the old one."""
    global _chooser
    previous, _chooser = _chooser, chooser
    return previous


def choose(problem: Problem, kernel: str | None = None) -> Candidate:
    """Pick the candidate that runs ``problem``.

    Args:
        problem: the work to do.
        kernel: a candidate name to force, or ``None`` to let the tuner decide.

    Raises:
        ValueError: if ``kernel`` is unknown or cannot run ``problem`` here.
    """
    if kernel is not None:
        candidate = get(problem.op, kernel)
        if not candidate.handles(problem):
            raise ValueError(
                f"[mlx_w8a8.{problem.op}] kernel {kernel!r} cannot run {problem.op} for M={problem.m}, "
                f"N={problem.n}, K={problem.k}, dtype={problem.dtype}, "
                f"format={problem.weight_format} on this machine; available: "
                f"{names(candidates(problem))}"
            )
        return candidate
    found = candidates(problem)
    if _chooser is not None:
        try:
            picked = _chooser(problem, found)
        except Exception:  # the tuner logs its own failures; inference goes on
            picked = None
        if picked is not None:
            return picked
    return fallback(problem)


def names(found: Iterable[Candidate]) -> list[str]:
    return [c.name for c in found]
