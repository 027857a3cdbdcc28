"""Compile a model's kernels ahead of its first calls: :func:`warm_up`.

MLX compiles each custom kernel (name and template arguments) the first time it is
evaluated in a process, and keeps custom kernels in memory only, so a new process
compiles them again: its first prefill, and the first one at a length that needs
another kernel or tile, stall for seconds (``docs/cuda.md``, "First calls compile
kernels"). :func:`warm_up` makes those compiles happen before the first request.

It does not call every layer at every length. Layers that behave identically (the same
shape, weight format, group size, bias, forced kernel, scales dtype and sibling group)
are scanned once; for each M it computes the decision the layer's call would take
(:meth:`mlx_w8a8.Linear.decision`, the sibling launch included) without launching
anything, and what that candidate compiles for the problem
(``registry.Candidate.variant``). Only the first M of each new (candidate, variant) is
called.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Hashable, NamedTuple

import mlx.core as mx
import mlx.nn as nn

from . import siblings
from .kernels import registry
from .nn import Linear
from .plans import clear_shared_activations
from .weight import FLOAT_DTYPES

_OP = "mlx_w8a8.warm_up"


class Compiled(NamedTuple):
    """One warm-up call: layers fed one ``[1, m, K]`` input, evaluated.

    Args:
        layers: the paths of the layers called, in call order (the members of a sibling
            group, or one layer).
        m: the rows of the input.
        kernels: what the call ran: a candidate name per layer, or one name with
            ``"+siblings"`` for a launch computing the whole group.
        seconds: the wall time of the call and its evaluation (compiles included).
    """

    layers: tuple[str, ...]
    m: int
    kernels: tuple[str, ...]
    seconds: float


class WarmUpReport(NamedTuple):
    """What :func:`warm_up` did.

    Args:
        compiled: the calls made, in order.
        layers: the ``mlx_w8a8.Linear`` layers in the model.
        groups: the groups of identical layers (or sibling groups) scanned.
        scan_seconds: the time spent computing decisions and variants.
        seconds: the wall time of the whole warm-up.
    """

    compiled: list[Compiled]
    layers: int
    groups: int
    scan_seconds: float
    seconds: float


def _layer_key(layer: Linear, dtype: mx.Dtype) -> Hashable:
    """What makes two layers decide and compile alike."""
    bias = layer.get("bias")
    return (type(layer), layer.problem(1, dtype), layer.kernel, layer["scales"].dtype,
            None if bias is None else bias.dtype)


def _units(model: nn.Module) -> tuple[list[tuple[tuple[str, Linear], ...]], int]:
    """``(units, layers)``: the model's ``mlx_w8a8.Linear`` layers as the units a model
    calls with one input (a sibling group's members in call order, else one layer),
    each with its path, in model order; and the number of layers."""
    found = [(path, m) for path, m in reversed(model.named_modules()) if isinstance(m, Linear)]
    path_of = {id(layer): path for path, layer in found}
    units, placed = [], set()
    for path, layer in found:
        if id(layer) in placed:
            continue
        members = layer.siblings.members() if layer.siblings is not None else None
        if members is None or not all(id(member) in path_of for member in members):
            members = [layer]
        units.append(tuple((path_of[id(member)], member) for member in members))
        placed.update(id(member) for member in members)
    return units, len(found)


def _variant(candidate: registry.Candidate, problem: registry.Problem) -> Hashable:
    return None if candidate.variant is None else candidate.variant(problem)


def _parts(unit, m: int, dtype: mx.Dtype) -> tuple:
    """What a call of ``unit``'s layers on one ``[1, m, K]`` input compiles: a
    ``("siblings", members, candidate, variant)`` for a sibling launch (the layer's own
    ``Linear._group_decision``), else ``(index, candidate, variant)`` per layer."""
    if len(unit) > 1 and siblings.together():
        found = unit[0][1]._group_decision(m, dtype)
        if found is not None:
            candidate, _, members, problem = found
            return (("siblings", len(members), candidate.name, _variant(candidate, problem)),)
    parts = []
    for i, (_, layer) in enumerate(unit):
        problem = layer.problem(m, dtype)
        candidate = registry.choose(problem, layer.kernel)
        parts.append((i, candidate.name, _variant(candidate, problem)))
    return tuple(parts)


def _plan(model: nn.Module, max_tokens: int, dtype: mx.Dtype):
    """``(plans, layers, scan_seconds)``: per group of identical units (the first
    unit stands for the group), ``(unit, [(m, parts), ...])`` at the first M of each new
    part (:func:`_parts`), nothing launched; the number of layers; the scan's time."""
    units, layers = _units(model)
    if not units:
        raise ValueError(
            f"[{_OP}] model holds no mlx_w8a8.Linear layer (nothing to compile), got "
            f"{type(model).__name__}; convert it first (mlx_w8a8.quantize or mlx_w8a8.load)"
        )
    scanned, plans, scan_seconds = set(), [], 0.0
    for unit in units:
        key = (tuple(_layer_key(layer, dtype) for _, layer in unit),
               len(unit) > 1 and unit[0][1].siblings.enabled)
        if key in scanned:
            continue
        scanned.add(key)
        t0 = time.perf_counter()
        seen, calls = set(), []
        for m in range(1, max_tokens + 1):
            parts = _parts(unit, m, dtype)
            if not seen.issuperset(parts):
                seen.update(parts)
                calls.append((m, parts))
        scan_seconds += time.perf_counter() - t0
        plans.append((unit, calls))
    return plans, layers, scan_seconds


def _check(model, max_tokens, dtype) -> None:
    if not isinstance(model, nn.Module):
        raise ValueError(f"[{_OP}] model must be an mlx.nn.Module, got {type(model).__name__}")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"[{_OP}] max_tokens must be an int >= 1, got {max_tokens!r}")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"[{_OP}] dtype must be mx.float16, mx.bfloat16 or mx.float32, got {dtype!r}"
        )


def forget_memos() -> None:
    """Drop this thread's memoised activations and sibling outputs: after calls on inputs
    made only to compile (a warm-up, a model pass), nothing later may take them."""
    siblings.clear()
    clear_shared_activations()


def warm_up(
    model: nn.Module,
    max_tokens: int = 2048,
    dtype: mx.Dtype = mx.bfloat16,
    progress: bool = True,
) -> WarmUpReport:
    """Compile every kernel the model's ``mlx_w8a8.Linear`` layers would launch for
    inputs of 1 to ``max_tokens`` rows, so that later calls at those sizes compile none.

    Layers that behave identically are scanned once. For each M the decision a call
    would take (a sibling launch included) and what its candidate compiles
    (``registry.Candidate.variant``) are computed without launching; at the first M of
    each new (candidate, variant) a representative is called on ``mx.zeros((1, M, K),
    dtype)`` and the outputs are evaluated (a sibling group: every member, in order, on
    the same input, as a model calls them). A candidate with no ``variant`` is called
    once. The decisions are the tuner's at the time of the call: warm up after loading
    tuning tables (and with online tuning on, the scan measures what the calls would).
    A tensor-parallel model's sharded layers communicate: call it on every rank.

    A server meeting many prompt lengths may also call ``gc.freeze()`` once loading and
    warming up are done, so that Python's cyclic collector leaves everything alive then
    out of its full collections. Layers keep plans from a length's second call only, so
    lengths met once leave little to collect (5 ms of collection over 30 new lengths of a
    32-layer Llama-3-8B on an NVIDIA H200's host; README, "Prompts of new lengths").

    Args:
        model: a module holding ``mlx_w8a8.Linear`` layers (e.g. from
            :func:`mlx_w8a8.quantize` or :func:`mlx_w8a8.load`), or one such layer.
        max_tokens: the largest M (product of the input's leading dimensions) to
            prepare for. Default: ``2048``.
        dtype: the activation dtype the model runs in. Default: ``mx.bfloat16``.
        progress: print a line per call to stderr (layers, M, kernels, seconds).
            Default: ``True``.

    Returns:
        A :class:`WarmUpReport`: the calls made (:class:`Compiled`) and the times.

    Raises:
        ValueError: if ``model`` is not a module or holds no ``mlx_w8a8.Linear``, if
            ``max_tokens`` is not an int >= 1, or ``dtype`` not a float dtype.
    """
    _check(model, max_tokens, dtype)
    start = time.perf_counter()
    plans, layers, scan_seconds = _plan(model, max_tokens, dtype)
    compiled = []
    for unit, calls in plans:
        paths = tuple(path for path, _ in unit)
        k = unit[0][1].input_dims
        for m, parts in calls:
            kernels = tuple(p[2] + "+siblings" if p[0] == "siblings" else p[1] for p in parts)
            x = mx.zeros((1, m, k), dtype=dtype)
            t0 = time.perf_counter()
            mx.eval([layer(x) for _, layer in unit])
            seconds = time.perf_counter() - t0
            compiled.append(Compiled(paths, m, kernels, seconds))
            if progress:
                where = "+".join([paths[0]] + [p.rsplit(".", 1)[-1] for p in paths[1:]])
                print(f"[{_OP}] {where or '<model>'} M={m}: {', '.join(kernels)} {seconds:.2f} s",
                      file=sys.stderr, flush=True)
    forget_memos()
    total = time.perf_counter() - start
    if progress:
        print(f"[{_OP}] {len(compiled)} calls for {layers} layers ({len(plans)} groups) in "
              f"{total:.2f} s (scan {scan_seconds:.2f} s, "
              f"{math.fsum(c.seconds for c in compiled):.2f} s in calls)",
              file=sys.stderr, flush=True)
    return WarmUpReport(compiled, layers, len(plans), scan_seconds, total)
