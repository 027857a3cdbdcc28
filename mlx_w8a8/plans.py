"""Plans: what a call of ``mlx_w8a8.Linear`` or :func:`mlx_w8a8.w8a8_linear` runs, decided
once per input shape and kept.

One path serves a layer, a layer's sibling group and the functional op:

- decide: :func:`mlx_w8a8.kernels.registry.decide` picks the candidate for the call's
  problem (a forced kernel, a table entry, a borrowed or prior decision, the fallback);
- bind: the candidate's launches are prepared for the weight, the bias and the input's
  leading shape (``Candidate.bind_stages`` / ``bind`` for a layer, :class:`BoundPlan`;
  ``bind_group`` for a sibling group, :class:`GroupPlan`; :func:`weight_plan` for
  ``w8a8_linear``), so a call only launches;
- keep: a :class:`PlanCache` (one per layer, one per weight for ``w8a8_linear``) keeps
  the plan per input key from the key's second call on. The first call's plan serves that
  call alone and only its key is remembered: a server meets most prompt lengths once, and
  every object kept at a new shape is one more for Python's cyclic collector to promote
  and later scan (on an NVIDIA H200's host the collector ran about as long as the builds
  themselves over 32-layer Llama-3-8B prefills at new lengths); keys are tuples of ints,
  dtypes and ids, which the collector stops tracking.

Invalidation is pushed, never polled per call: every cache registers with
:func:`mlx_w8a8.kernels.registry.watch` and is cleared by
:func:`~mlx_w8a8.kernels.registry.invalidate` (a table loaded or re-pointed, a candidate
registered, a measurement recorded); a layer's cache is also cleared when its
parameters, forced kernel or group change. A kept call is therefore one dictionary hit.
A plan made while an invalidation happened serves its call and is not kept.

Cache policy, the one bound: a cache remembers at most :data:`LIMIT` keys; past it, it
starts over (keys, kept plans and decisions alike), so a process fed ever-new shapes
re-decides rather than grows.

Layers that receive the same input array (q/k/v projections, gate/up) quantize it once:
two-stage candidates (``Candidate.stages``) share the int8 activations through a small
per-thread memo keyed by the input's identity (:class:`Stages`).
"""

from __future__ import annotations

import functools
import math
import threading

import mlx.core as mx

from . import siblings as _siblings
from .kernels import registry
from .kernels.registry import Problem

# Keys a cache remembers (its kept plans and decisions are of these keys) before it starts
# over; a key met again after that keeps its plan one call later.
LIMIT = 256


class PlanCache:
    """The plans of one owner (a layer, or a weight for ``w8a8_linear``) by input key.

    ``plans`` maps a key to the ready callable a call with it runs (kept from the key's
    second call: :meth:`keep`); ``decisions`` maps the keys met to what they ran
    (``(m, kernel name, source)`` for a layer, shown by its ``repr``); ``handed`` holds at
    most one plan a sibling made for the owner's next call (:meth:`hand`). The dicts are
    cleared in place, never replaced, so an owner may hold them directly.

    Args:
        group: the :class:`mlx_w8a8.siblings.Siblings` whose shared launches bind the
            owner's arrays (reset with the cache), or ``None``.
    """

    __slots__ = ("plans", "decisions", "handed", "group", "_met", "__weakref__")

    def __init__(self, group=None):
        self.plans: dict = {}
        self.decisions: dict = {}
        self.handed: dict = {}
        self.group = group
        self._met: set = set()
        registry.watch(self)

    def met(self, key) -> bool:
        """Whether a call with ``key`` was met before (its plan, made now, is kept)."""
        return key in self._met

    def keep(self, key, plan, decision=None, stamp=None):
        """``plan``, kept for ``key`` if the key was met before; a key met for the first
        time is remembered and its plan serves this call only.

        Args:
            key: the input key (hashable; a layer's ``(shape, dtype)``).
            plan: ``f(x) -> y``.
            decision: what the plan runs, recorded in ``decisions`` (``None``: nothing).
            stamp: ``registry.generation`` read before deciding: a plan decided across an
                invalidation is not kept (``None``: no check).

        Returns:
            ``plan``.
        """
        met = self._met
        if key in met:
            if stamp is None or stamp == registry.generation:
                self.plans[key] = plan
        else:
            if len(met) >= LIMIT:
                met.clear()
                self._forget()
            met.add(key)
        if decision is not None:
            self.decisions[key] = decision
        return plan

    def hand(self, key, plan, decision, stamp) -> None:
        """Leave ``plan`` for the owner's next call, at input ``key`` (a sibling's)."""
        self.handed.clear()
        self.handed[key] = (plan, decision, stamp)

    def take(self, key):
        """The plan handed for ``key`` (kept as :meth:`keep` keeps), or ``None``."""
        handed = self.handed.pop(key, None)
        return None if handed is None else self.keep(key, *handed)

    def drop(self) -> None:
        """Drop the plans, decisions and handed plans (they re-decide); the keys met stay
        met, so a re-decided plan is kept at once."""
        self.plans.clear()
        self.decisions.clear()
        self.handed.clear()

    def _forget(self) -> None:
        """:meth:`drop`, and the owner's group forgets its shared launches and every
        member's plans (what :func:`registry.invalidate` calls)."""
        self.drop()
        if self.group is not None:
            self.group.reset()


def weight_plan(candidate, problem: Problem, weight, bias, lead, kept: bool):
    """``f(x) -> y`` for ``x`` ``[*lead, K]``: ``w8a8_linear``'s call of ``candidate`` on
    ``weight`` and ``bias``. A plan to keep runs the launches bound to them
    (``registry.bound_call``, where the candidate has ``bind_stages``); one serving a
    single call runs ``candidate.run`` (direct launches, nothing traced or bound). The
    plan holds ``bias``, whose id keys it."""
    if kept and candidate.bind_stages is not None:
        f = functools.partial(_holding, registry.bound_call(candidate, problem, weight, bias),
                              bias)
    else:
        run = candidate.run
        f = lambda x2: run(x2, weight, bias)  # noqa: E731
    if len(lead) == 1:
        return f
    m, k, shape = problem.m, problem.k, (*lead, problem.n)
    return lambda x: f(x.reshape(m, k)).reshape(shape)


def _holding(f, held, x):
    """``f(x)``; ``held`` is only kept alive."""
    return f(x)


def layer_plan(layer, candidate, problem: Problem, lead, out_shape):
    """A layer's plan of ``candidate`` alone: ``candidate.bind(layer, problem)`` where it
    has one (``mx.quantized_matmul``), on the input's rows as one matrix, else its bound
    launches (:meth:`BoundPlan.run`)."""
    if candidate.bind is None:
        return BoundPlan(layer, candidate, problem, lead, out_shape).run
    f = candidate.bind(layer, problem)
    if math.prod(lead[:-1]) == 1:
        return f
    # Hazard: mx.quantized_matmul takes every dimension of x before the last two as a
    # batch. Batched decode feeds [B, 1, K]: on CUDA (MLX 0.32, sm_90) that is B products
    # of one row, each reading the whole weight, where [B, K] is one product of B rows
    # (what the tuner times). [1, T, K] (prefill) and [1, 1, K] (decode) stay as they are.
    m, k = problem.m, problem.k
    return lambda x: f(x.reshape(m, k)).reshape(out_shape)


_outlier_memo = threading.local()


def outlier_split(x: mx.array, key, idx: mx.array, mask: mx.array):
    """``(x * mask, x[..., idx])`` for a layer with outlier channels ``key``
    (:attr:`mlx_w8a8.Linear.outliers`; ``idx`` those channels, ``mask`` zero on them):
    the same two arrays again for the next layer fed the same ``x`` with the same
    channels (q/k/v, gate/up), so their shared quantize and sibling launches meet one
    input array. One entry per thread."""
    last = getattr(_outlier_memo, "last", None)
    if last is not None and last[0] is x and last[1] == key and last[2] == mask.dtype:
        return last[3], last[4]
    masked, out = x * mask, mx.take(x, idx, axis=-1)
    _outlier_memo.last = (x, key, mask.dtype, masked, out)
    return masked, out


# Activations memoised per thread: enough for q/k/v (or gate/up) fed the same x.
_SHARED_SLOTS = 4
# Offers of activations nobody took after which a fused layer stops offering (Stages).
# Hazard: the switch traces the output-only call (mx.compile, per input shape), so it
# must come early: at one, on the layer's second call at a shape. A later switch lands
# inside a benchmark's steady-state rounds (at 4, round 3 of a 6-round model bench ran
# 0.4-1.8 ms slow on 4 layers of an NVIDIA H200: 17 traced calls).
_UNTAKEN_OFFERS = 1
_shared = threading.local()


def share_activations(enabled: bool = True) -> None:
    """Turn the sharing of quantized activations between layers fed the same input on
    (the default) or off (to measure what it saves). Applies to later calls."""
    global _SHARE
    _SHARE = bool(enabled)
    clear_shared_activations()


_SHARE = True


class Stages:
    """A bound two-stage call, ``apply(quantize(x2))``, sharing the quantized activations
    with other layers fed the same ``x`` through the per-thread memo.

    A call first takes activations another layer left in the memo for this ``x`` and
    ``key``; otherwise it quantizes and offers its own. With ``fused`` (stages made of
    MLX custom kernels: ``Candidate.bind_stages`` / ``bind_group``) both launches are
    one compiled call (``registry.fuse_stages``), and returning the activations from it
    costs Python per call (about 2 us on an NVIDIA H200's host); so once its offer
    was taken by no other layer (``_UNTAKEN_OFFERS``: an ``o_proj``, a ``down_proj``),
    this layer stops offering and runs the call that returns the output alone, still
    taking what others offer. A layer whose offers are taken (the first of q/k/v fed
    one ``x``) keeps offering. The plan's first call runs the stages directly (no
    trace: a shape met once, such as a server's prompt length, costs its launches
    alone); its second call traces the compiled call it keeps (with activations, or
    output-only for a layer that stopped offering), so a plan settles on its second
    call (each ``mx.compile`` traces once per input shape). A layer keeps a plan from its
    second call at a shape (:meth:`PlanCache.keep`), so the layer settles on its third.

    The memo holds a reference to ``x`` so its identity cannot be reused while the
    entry lives; entries are replaced first-in first-out.
    """

    __slots__ = ("key", "quantize", "apply", "fused", "_both", "_lean", "last", "untaken",
                 "fresh")

    def __init__(self, key, quantize, apply, fused: bool):
        self.key, self.quantize, self.apply, self.fused = key, quantize, apply, fused
        # The compiled calls are made when first used: a plan met once (a new prompt
        # length) may use one or neither, and each costs Python to make.
        self._both = self._lean = None
        self.last = None  # the "taken" mark of this layer's last offer
        self.untaken = 0
        # The plan's first call runs the stages themselves, whose bound launches are made
        # directly on their first call (cuda.launch.LaunchSpec.bound): a shape met once
        # traces nothing. The compiled calls trace on the second.
        self.fresh = True

    def both(self, x2):
        """The fused call returning ``(y, acts)``."""
        if self._both is None:
            self._both = registry.fuse_stages(self.quantize, self.apply, activations=True)
        return self._both(x2)

    def lean(self, x2):
        """The fused call returning ``y`` alone."""
        if self._lean is None:
            self._lean = registry.fuse_stages(self.quantize, self.apply)
        return self._lean(x2)

    def __call__(self, x: mx.array, x2: mx.array | None = None):
        """``y`` for ``x`` (the memo's key) run as ``x2`` (``x`` reshaped, or ``x``)."""
        if x2 is None:
            x2 = x
        if not _SHARE:
            return self.lean(x2) if self.fused else self.apply(self.quantize(x2))
        slots = getattr(_shared, "slots", None)
        if slots is None:
            slots = _shared.slots = []
        key = self.key
        for slot in slots:
            if slot[0] is x and slot[1] == key:
                slot[3][0] = True
                return self.apply(slot[2])
        if self.last is not None:  # was the last offer taken?
            self.untaken = 0 if self.last[0] else self.untaken + 1
            self.last = None
        if self.fused and self.untaken >= _UNTAKEN_OFFERS:
            return self.lean(x2)
        if not self.fused or self.fresh:
            self.fresh = False
            acts = self.quantize(x2)
            y = self.apply(acts)
        else:
            y, acts = self.both(x2)
        # The layer keeps only the slot's "taken" mark: holding the slot itself would keep
        # x and its activations alive after the memo dropped them, in every layer.
        self.last = [False]
        slots.append((x, key, acts, self.last))
        if len(slots) > _SHARED_SLOTS:
            del slots[0]
        return y


class GroupPlan:
    """A sibling member's plan when the group runs as one launch (``candidate.bind_group``
    on the summed ``problem``): the first member called on an ``x`` launches for all
    and leaves the others' outputs in the sibling memo; a member finding its output
    there only takes it. The launch is bound once per input shape for the group
    (``Siblings.bound``) and again when a member's weight or bias is replaced.

    The layer keeps the bound method ``run`` per input shape, from its second call at
    the shape (:meth:`PlanCache.keep`; a plan serving one call, ``kept=False``, binds the
    group launch for that call only): it calls as fast as a closure (a slotted object's
    ``__call__`` measured twice the call overhead), and it and this object are two
    objects for Python's cyclic collector to promote and later scan at every new prompt
    length, where a closure's function, cells and closure tuple were about a dozen.
    """

    __slots__ = ("layer", "candidate", "problem", "lead", "out_shape", "group", "i", "key",
                 "fmt", "alone", "kept")

    def __init__(self, layer, candidate, problem: Problem, lead, out_shape, kept: bool = True):
        self.layer, self.candidate, self.problem = layer, candidate, problem
        self.lead, self.out_shape, self.kept = lead, out_shape, kept
        self.group = group = layer._siblings
        self.i = group.index(layer)
        self.key = (lead, problem.dtype)
        self.fmt = layer.format
        self.alone = None  # the layer's own plan, made on first use (launch_together(False))

    def run(self, x):
        group = self.group
        if not _siblings.together():
            if self.alone is None:
                self.alone = self.layer._alone_plan(
                    self.problem.m, x.dtype, self.lead, self.out_shape)[2]
            return self.alone(x)
        y = group.take(x, self.i)
        if y is not None:
            return y
        state = group.bound.get(self.key)
        if state is None or not group.holds(state[0]):
            # first launch, a member gone, or a member's arrays replaced (also without
            # __setitem__, as mx.compile(inputs=...) does): check and bind
            state = self._bind()
            if state is None:  # a member gone or its format changed: re-decided alone
                return self.layer(x)
        ys = state[1](x)
        group.put(x, ys, self.i)
        return ys[self.i]

    def _bind(self):
        group = self.group
        members = group.members()
        if members is None:
            group.reset()
            return None
        pairs = []
        for layer in members:
            w = layer._weight(self.fmt)
            if w is None:
                group.reset()
                return None
            pairs.append((w, layer.get("bias")))
        act_key, quantize, apply = self.candidate.bind_group(self.problem, pairs, self.lead)
        run = apply if quantize is None else Stages(act_key, quantize, apply, True)
        state = (_siblings.arrays(members), run)
        if self.kept:  # a plan that serves one call binds for that call alone
            group.bound[self.key] = state
        return state


class BoundPlan:
    """A layer's plan through a candidate's ``bind_stages`` (the kernels take ``x``
    ``[..., K]`` as it comes: no reshape) or, for one without, :func:`_stages_as_bound`
    on ``x`` reshaped to ``[M, K]``. Its launches are prepared for the current weight and
    bias on the first call and again only when those arrays are replaced (e.g. by
    ``mx.compile(..., inputs=model.state)``, which swaps them without going through
    ``__setitem__``); each call otherwise only launches. The layer keeps the bound method
    :meth:`run`, as :class:`GroupPlan`'s (a closure's cells were a dozen objects for the
    cyclic collector per plan).
    """

    __slots__ = ("layer", "problem", "fmt", "fused", "bind_stages", "flat", "out_shape",
                 "held", "apply", "stages")

    def __init__(self, layer, candidate, problem: Problem, lead, out_shape):
        self.layer, self.problem, self.out_shape = layer, problem, out_shape
        self.fmt = layer.format  # the format decided for: another one re-decides
        self.fused = candidate.bind_stages is not None
        if self.fused:
            self.flat = False
            self.bind_stages = functools.partial(_bind_with_lead, candidate.bind_stages, lead)
        else:
            self.flat = len(lead) != 1
            self.bind_stages = _stages_as_bound(candidate, problem)
        self.held = (None,) * 4  # _siblings.arrays((layer,)) as bound
        self.apply = self.stages = None

    def run(self, x):
        layer, held = self.layer, self.held
        # The arrays themselves are compared (cheap); the weight is rebuilt, its format
        # checked and the launches bound only when one was replaced. The comparison is
        # written out rather than through arrays(): building that list on every call cost
        # the layer's Python ~10% (bench/layer_host_stub.py).
        if (layer["weight"] is not held[0] or layer["scales"] is not held[1]
                or layer["biases"] is not held[2] or layer.get("bias") is not held[3]):
            qw = layer._weight(self.fmt)
            if qw is None:  # new weights changed the format: re-decide
                return layer(x)
            act_key, quantize, self.apply = self.bind_stages(self.problem, qw, layer.get("bias"))
            self.stages = (None if quantize is None else
                           Stages(act_key, quantize, self.apply, self.fused))
            self.held = _siblings.arrays((layer,))
        if self.flat:
            problem = self.problem
            x2 = x.reshape(problem.m, problem.k)
            y = self.apply(x2) if self.stages is None else self.stages(x, x2)
            return y.reshape(self.out_shape)
        return self.apply(x) if self.stages is None else self.stages(x, x)


def _bind_with_lead(bind_stages, lead, problem, weight, bias):
    """``candidate.bind_stages`` for inputs ``[*lead, K]``."""
    return bind_stages(problem, weight, bias, lead)


def _stages_as_bound(candidate, problem):
    """``bind_stages`` for a candidate without one: its ``stages`` (or ``run``) with the
    weight, bias and output dtype fixed at bind time; nothing else is prepared."""
    stages = candidate.stages(problem) if candidate.stages else None
    if stages is None:  # one stage: run(x, w, b) does it all
        run = candidate.run
        return lambda p, w, b: (None, None, lambda x2: run(x2, w, b))
    act_key, quantize, apply = stages
    dtype = getattr(mx, problem.dtype)
    return lambda p, w, b: (act_key, quantize, lambda acts: apply(acts, w, b, dtype))


def clear_shared_activations() -> None:
    """Drop this thread's memoised activations (they are otherwise held until replaced)."""
    _shared.slots = []


