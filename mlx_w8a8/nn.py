"""``mlx_w8a8.Linear``: a W8A8 drop-in for ``nn.Linear`` and 8-bit ``nn.QuantizedLinear``.

The hot path is built like MLX's own layers: decide once, run many times. The first
call with a given input shape and dtype resolves the kernel (a forced ``layer.kernel``,
a tuning-table entry, a decision borrowed from a nearby measured shape, the built-in
prior, or ``mx.quantized_matmul``) into a ready closure that later calls reuse; the
weight format is a static attribute fixed at construction or conversion. Anything that
can change a decision (a table reload, ``set_tuning_table``, a recorded measurement, a
kernel registered, a new ``layer.kernel``) clears the layer's plans
(``registry.invalidate``), so the next call re-decides.

Layers that receive the same input array (q/k/v projections, gate/up) quantize it once:
the two-stage candidates (``Candidate.stages``) share the int8 activations through a
small per-thread memo keyed by the input's identity. Candidates with ``bind_stages``
(the CUDA ones) prepare their launches once per decision and weight and run both as one
compiled call, so a call only replays them; such a layer stops offering its activations
to the memo after an offer nobody took (``_Stages``). Linked siblings
(:mod:`mlx_w8a8.siblings`) go further where the kernel allows: one launch computes all
of their outputs.
"""

from __future__ import annotations

import functools
import math
import threading

import mlx.core as mx
import mlx.nn as nn

from . import met
from . import siblings as _siblings
from .kernels import registry
from .kernels.registry import Problem
from .weight import BITS, FLOAT_DTYPES, QuantizedWeight, check_group_size, describe, dtype_name

# Plans kept per layer (one per distinct input shape and dtype); beyond that the
# cache starts over (a model fed ever-new shapes re-decides, it does not grow).
_MAX_PLANS = 64
# A plan is kept from the second call at its input shape on; the first call's plan runs
# once and is dropped (Linear._keep, mlx_w8a8.met: why, and the bound on the keys kept).
# Activations memoised per thread: enough for q/k/v (or gate/up) fed the same x.
_SHARED_SLOTS = 4
# Offers of activations nobody took after which a fused layer stops offering (_Stages).
# Hazard: the switch traces the output-only call (mx.compile, per input shape), so it
# must come early: at one, on the layer's second call at a shape. A later switch lands
# inside a benchmark's steady-state rounds (at 4, round 3 of a 6-round model bench ran
# 0.4-1.8 ms slow on 4 layers of an NVIDIA H200: 17 traced calls).
_UNTAKEN_OFFERS = 1
_shared = threading.local()
_PARAMETERS = frozenset(("weight", "scales", "biases", "bias"))


def share_activations(enabled: bool = True) -> None:
    """Turn the sharing of quantized activations between layers fed the same input on
    (the default) or off (to measure what it saves). Applies to later calls."""
    global _SHARE
    _SHARE = bool(enabled)
    clear_shared_activations()


_SHARE = True


class _Stages:
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
    second call at a shape (:meth:`Linear._keep`), so the layer settles on its third.

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
        # directly on their first call (cuda_launch.LaunchSpec.bound): a shape met once
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


class _GroupPlan:
    """A sibling member's plan when the group runs as one launch (``candidate.bind_group``
    on the summed ``problem``): the first member called on an ``x`` launches for all
    and leaves the others' outputs in the sibling memo; a member finding its output
    there only takes it. The launch is bound once per input shape for the group
    (``Siblings.bound``) and again when a member's weight or bias is replaced.

    The layer keeps the bound method ``run`` per input shape, from its second call at
    the shape (:meth:`Linear._keep`; a plan serving one call, ``kept=False``, binds the
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
        run = apply if quantize is None else _Stages(act_key, quantize, apply, True)
        state = (_siblings.arrays(members), run)
        if self.kept:  # a plan that serves one call binds for that call alone
            group.bound[self.key] = state
        return state


class _BoundPlan:
    """A layer's plan through a candidate's ``bind_stages`` (the kernels take ``x``
    ``[..., K]`` as it comes: no reshape) or, for one without, :func:`_stages_as_bound`
    on ``x`` reshaped to ``[M, K]``. Its launches are prepared for the current weight and
    bias on the first call and again only when those arrays are replaced (e.g. by
    ``mx.compile(..., inputs=model.state)``, which swaps them without going through
    ``__setitem__``); each call otherwise only launches. The layer keeps the bound method
    :meth:`run`, as :class:`_GroupPlan`'s (a closure's cells were a dozen objects for the
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
                           _Stages(act_key, quantize, self.apply, self.fused))
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


class Linear(nn.Module):
    """Applies ``y = x @ W.T + b`` with ``W`` an 8-bit (or 4-bit) weight, activations
    quantized to int8 per token where the chosen kernel is a W8A8 (W4A8) one.

    Its parameters are those of an 8-bit ``nn.QuantizedLinear`` (``weight`` ``[N, K //
    4]`` uint32, ``scales``, ``biases`` ``[N, K // group_size]``, optional ``bias``
    ``[N]``), so a model saved with it loads in stock mlx-lm as an 8-bit model and an
    mlx-lm 8-bit checkpoint loads into it; a layer converted from a 4-bit
    ``nn.QuantizedLinear`` holds that layer's arrays as they are (``weight`` ``[N, K //
    8]``, ``bits == 4``) and saves as the same 4-bit layer. ``format``
    (``"per_channel"``, ``"grouped"`` or ``"grouped4"``) is a static attribute like
    ``bits`` and ``group_size``.

    Which kernel runs is decided on the first call per input shape and dtype (a
    tuning-table entry, a nearby measured shape, the built-in prior, else
    ``mx.quantized_matmul``) and reused; ``repr(layer)`` shows the decisions. Set
    ``layer.kernel`` to a candidate name to force one (``"exact"`` is the exact W8A8
    math on any device).

    Args:
        input_dims: K, the input features.
        output_dims: N, the output features.
        bias: whether to add a learned bias. Default: ``True``.
        group_size: 32, 64 or 128, dividing ``input_dims``. Default: ``64``.
        per_channel: initialise a symmetric per-channel int8 weight (the format int8
            GEMM runs on directly) rather than group-wise affine. Default: ``True``.
            8 bits only.
        bits: 8 (default) or 4: a 4-bit layer holds group-wise affine 4-bit codes, as
            ``mx.quantize(w, group_size, bits=4)`` writes them (``per_channel`` is not
            used).
    """

    # Layers of classes that set this may be linked as siblings (mlx_w8a8.siblings.member:
    # a class attribute, so that siblings, which this module imports, need not import it).
    SIBLING_MEMBER = True

    def __init__(
        self,
        input_dims: int,
        output_dims: int,
        bias: bool = True,
        group_size: int = 64,
        per_channel: bool = True,
        bits: int = 8,
    ):
        super().__init__()
        if isinstance(bits, bool) or bits not in BITS:
            raise ValueError(f"[mlx_w8a8.Linear] bits must be one of {BITS}, got {bits!r}")
        for label, value in (("input_dims", input_dims), ("output_dims", output_dims)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(
                    f"[mlx_w8a8.Linear] {label} must be a positive int, got {value!r}"
                )
        check_group_size("mlx_w8a8.Linear", group_size, input_dims)
        scale = math.sqrt(1.0 / input_dims)
        w = mx.random.uniform(low=-scale, high=scale, shape=(output_dims, input_dims))
        self._init_state()
        if bits == 4:
            self._set_weight(QuantizedWeight.from_float(w, group_size, False, bits=4))
        else:
            self._set_weight(QuantizedWeight.from_float(w, group_size, per_channel))
        if bias:
            self.bias = mx.zeros((output_dims,))
        self.freeze()

    # --- static configuration -------------------------------------------------------------
    def _init_state(self) -> None:
        # Plain object attributes (not parameters): nn.Module stores dicts as children.
        object.__setattr__(self, "_kernel", None)
        object.__setattr__(self, "_plans", {})
        object.__setattr__(self, "_decisions", {})
        object.__setattr__(self, "_met", met.Met())  # input keys met before (_keep)
        # A plan a sibling made for this layer's next call at a new shape: {key: (plan,
        # decision)}, at most one entry, taken by that call (Linear._plan).
        object.__setattr__(self, "_handed", {})
        object.__setattr__(self, "_siblings", None)
        registry.watch(self)  # a table reload etc. clears this layer's plans

    def _set_weight(self, qw: QuantizedWeight) -> None:
        self.weight, self.scales, self.biases = qw.q, qw.scales, qw.biases
        self.group_size, self.bits, self.mode = qw.group_size, qw.bits, "affine"
        self.format = qw.format
        object.__setattr__(self, "_qw", qw)
        object.__setattr__(self, "_checked", qw.q)
        self._forget()

    def _forget(self) -> None:
        self._drop_plans()
        if self._siblings is not None:  # the group's launches bound this layer's state
            self._siblings.reset()

    def _drop_plans(self) -> None:
        """Drop the plans, decisions and handed plans (they re-decide); the shapes met
        stay met, so a re-decided plan is kept at once. Also what ``Siblings.reset``
        does to each member."""
        self._plans.clear()
        self._decisions.clear()
        self._handed.clear()

    def __setitem__(self, key, value) -> None:
        # Parameters are replaced through here (attribute assignment, update(),
        # load_weights(), set_dtype()): plans that bound dtypes re-decide.
        super().__setitem__(key, value)
        if key in _PARAMETERS:
            self._forget()

    @property
    def kernel(self) -> str | None:
        """The forced candidate name, or ``None`` to let the tuner decide."""
        return self._kernel

    @kernel.setter
    def kernel(self, name: str | None) -> None:
        if name is not None and not isinstance(name, str):
            raise ValueError(
                f"[mlx_w8a8.Linear] kernel must be a candidate name or None, got {name!r}"
            )
        if name is not None:
            registry.get("linear", name)  # unknown: ValueError naming the known kernels, now
        object.__setattr__(self, "_kernel", name)
        self._forget()

    @property
    def siblings(self):
        """The :class:`mlx_w8a8.siblings.Siblings` group this layer runs with (layers
        fed the same input, computed by one launch where a kernel allows), or ``None``.
        Set by :func:`mlx_w8a8.siblings.link` (which :func:`mlx_w8a8.quantize` and
        :func:`mlx_w8a8.load` call)."""
        return self._siblings

    @siblings.setter
    def siblings(self, group) -> None:
        if group is not None and not isinstance(group, _siblings.Siblings):
            raise ValueError(
                f"[mlx_w8a8.Linear] siblings must be a mlx_w8a8.siblings.Siblings or None, "
                f"got {type(group).__name__}"
            )
        self._forget()
        object.__setattr__(self, "_siblings", group)

    @property
    def quantized_weight(self) -> QuantizedWeight:
        """The layer's weight as a :class:`QuantizedWeight` of the layer's ``format``.

        Rebuilt (no host read) only when the parameter arrays were replaced, e.g. by
        ``load_weights``, ``update`` or ``mx.compile(..., inputs=model.state)``.
        """
        qw = self._weight(self.format)
        return qw if qw is not None else self._qw  # the format changed: _qw is the new one

    def _weight(self, fmt: str) -> QuantizedWeight | None:
        """The current weight, or ``None`` when replaced arrays changed the format from
        ``fmt`` (the caller's decision no longer applies)."""
        qw = self._qw
        w, s, b = self["weight"], self["scales"], self["biases"]
        if qw.q is not w or qw.scales is not s or qw.biases is not b:
            qw = self._rebuild(w, s, b)
        return qw if qw.format == fmt else None

    def _rebuild(self, w, s, b) -> QuantizedWeight:
        if self.bits == 4:  # one format: nothing to detect
            qw = QuantizedWeight(w, s, b, self.group_size, bits=4)
            object.__setattr__(self, "_qw", qw)
            return qw
        per_channel = self.format == "per_channel"
        qw = QuantizedWeight(w, s, b, self.group_size, per_channel=per_channel)
        if per_channel and self._checked is not w:
            # New weights under a per-channel claim: check the claim once (a host read).
            # Inside mx.compile the arrays are traced and cannot be read; the claim made
            # at construction/conversion stands there.
            try:
                holds = QuantizedWeight(w, s, b, self.group_size).per_channel
            except ValueError:
                holds = None
            if holds is False:
                self.format = "grouped"
                qw = QuantizedWeight(w, s, b, self.group_size, per_channel=False)
                self._forget()
            if holds is not None:
                object.__setattr__(self, "_checked", w)
        object.__setattr__(self, "_qw", qw)
        return qw

    @property
    def input_dims(self) -> int:
        return self["weight"].shape[1] * (32 // self.bits)

    @property
    def output_dims(self) -> int:
        return self["weight"].shape[0]

    # --- decisions ----------------------------------------------------------------------
    def problem(self, m: int, dtype: mx.Dtype = mx.bfloat16) -> Problem:
        """The ``linear`` problem of a call with ``m`` tokens of ``dtype``."""
        return Problem(
            "linear", m, self.output_dims, self.input_dims, dtype_name(dtype), self.format,
            self.group_size, "bias" in self,
        )

    def decision(self, m: int, dtype: mx.Dtype = mx.bfloat16) -> tuple[str, str]:
        """``(kernel name, source)`` a call with ``m`` tokens of ``dtype`` would run;
        ``source`` is ``"forced"``, ``"table"``, ``"borrowed"``, ``"prior"``,
        ``"measured"`` or ``"fallback"``, with ``"+siblings"`` appended where the call
        runs as one launch with the layer's siblings (:mod:`mlx_w8a8.siblings`; the
        decision is then the one for their summed N)."""
        found = self._group_decision(m, dtype)
        if found is not None:
            return found[0].name, found[1] + "+siblings"
        candidate, source = registry.decide(self.problem(m, dtype), self._kernel)
        return candidate.name, source

    def _group_problem(self, m: int, dtype: mx.Dtype):
        """``(members, summed problem)`` when this layer's siblings could run as one
        launch at ``m`` tokens (the group is enabled and whole, nothing is forced, the
        members still agree in K, format, group size and bias), else ``None``."""
        group = self._siblings
        if group is None or not group.enabled or self._kernel is not None:
            return None
        members = group.members()
        if members is None or any(layer._kernel is not None for layer in members):
            return None
        if not _siblings.compatible(members):
            return None
        return members, Problem(
            "linear", m, sum(layer.output_dims for layer in members), self.input_dims,
            dtype_name(dtype), self.format, self.group_size, "bias" in self,
        )

    def _group_decision(self, m: int, dtype: mx.Dtype):
        """``(candidate, source, members, summed problem)`` when a call with ``m``
        tokens runs as one launch with this layer's siblings (:meth:`_group_problem`, and
        the kernel decided for their summed N has a multi-weight form), else ``None``."""
        found = self._group_problem(m, dtype)
        if found is None:
            return None
        members, problem = found
        candidate, source = registry.decide(problem)
        if candidate.bind_group is None:
            return None
        return candidate, source, members, problem

    def _plan(self, x: mx.array):
        op = "mlx_w8a8.Linear"
        if not isinstance(x, mx.array) or x.dtype not in FLOAT_DTYPES or x.ndim < 1:
            raise ValueError(
                f"[{op}] x must be a float16, bfloat16 or float32 array [..., K], "
                f"got {describe(x)}"
            )
        n, k = self.output_dims, self.input_dims
        if x.shape[-1] != k:
            raise ValueError(
                f"[{op}] K mismatch: x has last dimension {x.shape[-1]} but the layer "
                f"takes input_dims = {k}"
            )
        key = (x.shape, x.dtype)
        handed = self._handed.pop(key, None)
        if handed is not None:  # a sibling planned this call (below)
            return self._keep(key, *handed)
        lead = tuple(x.shape[:-1])
        m = math.prod(lead)
        out_shape = (*lead, n)
        if m == 0:
            dtype = x.dtype
            plan = lambda x: mx.zeros(out_shape, dtype=dtype)  # noqa: E731
            return self._keep(key, plan, (0, "none", "empty"))
        found = self._group_decision(m, x.dtype)
        if found is not None:
            candidate, source, members, group_problem = found
            decision = (m, candidate.name, source + "+siblings")
            # Every member takes this shape's group launch: plan it for the members that
            # have no plan for the shape, so their first call at it (right after this
            # one, in a model) checks and decides nothing (a new prompt length's host
            # time, docs/cuda.md "Prompts of new lengths").
            for member in members:
                if member is not self and key not in member._plans:
                    member._hand(key, member._group_plan(
                        candidate, group_problem, lead, (*lead, member.output_dims),
                        key in member._met), decision)
            plan = self._group_plan(candidate, group_problem, lead, out_shape,
                                    key in self._met)
            return self._keep(key, plan, decision)
        candidate, source, plan = self._alone_plan(m, x.dtype, lead, out_shape)
        return self._keep(key, plan, (m, candidate.name, source))

    def _alone_plan(self, m: int, dtype: mx.Dtype, lead, out_shape):
        """``(candidate, source, plan)`` of this layer by itself (no siblings)."""
        problem = self.problem(m, dtype)
        candidate, source = registry.decide(problem, self._kernel)
        if candidate.bind is not None:
            return candidate, source, candidate.bind(self, problem)
        return candidate, source, self._bound_plan(candidate, problem, lead, out_shape)

    def _bound_plan(self, candidate, problem: Problem, lead, out_shape):
        """The plan of a candidate through its bound launches (:meth:`_BoundPlan.run`)."""
        return _BoundPlan(self, candidate, problem, lead, out_shape).run

    def _group_plan(self, candidate, problem: Problem, lead, out_shape, kept: bool = True):
        """This member's plan when the group runs as one launch (:meth:`_GroupPlan.run`);
        ``kept``: the layer will keep it (its launch is then shared with the group)."""
        return _GroupPlan(self, candidate, problem, lead, out_shape, kept).run

    def _hand(self, key, plan, decision) -> None:
        """Leave ``plan`` for this layer's next call, at input ``key`` (a sibling's)."""
        self._handed.clear()
        self._handed[key] = (plan, decision)

    def _keep(self, key, plan, decision):
        """``plan``, kept for input ``key`` if this layer met the key before (the
        second call at a shape keeps the plan it makes); the first call's plan serves
        that call only, and the key is remembered (:class:`mlx_w8a8.met.Met`)."""
        if self._met.again(key):
            if len(self._plans) >= _MAX_PLANS:
                self._forget()
            self._plans[key] = plan
        if len(self._decisions) >= met.LIMIT:
            self._decisions.clear()
        self._decisions[key] = decision
        return plan

    def __call__(self, x: mx.array) -> mx.array:
        """Args:
            x: ``[..., K]`` float16/bfloat16/float32.

        Returns:
            ``[..., N]`` in ``x.dtype``.
        """
        try:
            plan = self._plans[(x.shape, x.dtype)]
        except (KeyError, AttributeError):  # a new shape or dtype, or not an array
            plan = self._plan(x)
        return plan(x)

    def _extra_repr(self) -> str:
        text = (
            f"input_dims={self.input_dims}, output_dims={self.output_dims}, "
            f"bias={'bias' in self}, group_size={self.group_size}, format={self.format}"
        )
        if self.bits != 8:
            text += f", bits={self.bits}"
        if self._kernel is not None:
            text += f", kernel={self._kernel!r}"
        if self._siblings is not None and not self._siblings.enabled:
            text += f", siblings=off after {self._siblings.unused} unused launches"
        runs = sorted({v for v in self._decisions.values() if v[0] > 0})
        if runs:
            text += ", runs={" + ", ".join(f"M={m}: {name} ({src})" for m, name, src in runs) + "}"
        return text

    @classmethod
    def from_linear(
        cls, layer: nn.Module, group_size: int = 64, per_channel: bool = True
    ) -> "Linear":
        """Convert an ``nn.Linear`` or an 8-bit or 4-bit affine ``nn.QuantizedLinear``.

        Args:
            layer: the layer. An ``nn.Linear`` is quantized (``per_channel`` picks
                symmetric per-channel int8 or group-wise affine); an 8-bit
                ``nn.QuantizedLinear`` keeps its weights exactly (its own group size;
                its format is detected here, once); a 4-bit one keeps its arrays
                themselves (the same ``mx.array`` objects, format ``"grouped4"``).
            group_size: for ``nn.Linear`` only: 32, 64 or 128, dividing K.
            per_channel: for ``nn.Linear`` only.

        Raises:
            ValueError: for other layer types, other bit widths or modes.
        """
        op = "mlx_w8a8.Linear.from_linear"
        if isinstance(layer, nn.QuantizedLinear):
            if layer.bits not in BITS or getattr(layer, "mode", "affine") != "affine":
                raise ValueError(
                    f"[{op}] only 8-bit and 4-bit affine QuantizedLinear layers convert, "
                    f"got bits={layer.bits}, mode={getattr(layer, 'mode', 'affine')!r}"
                )
            qw = QuantizedWeight(layer.weight, layer.scales, layer.biases, layer.group_size,
                                 bits=layer.bits)
        elif isinstance(layer, nn.Linear):
            qw = QuantizedWeight.from_float(layer.weight, group_size, per_channel)
        else:
            raise ValueError(
                f"[{op}] layer must be an nn.Linear or an 8-bit or 4-bit nn.QuantizedLinear, "
                f"got {type(layer).__name__}"
            )
        return cls.from_weight(qw, layer.get("bias") if "bias" in layer else None)

    @classmethod
    def from_weight(cls, weight: QuantizedWeight, bias: mx.array | None = None) -> "Linear":
        """A layer holding ``weight`` (its format is taken from it) and ``bias``.

        Args:
            weight: a :class:`QuantizedWeight` ``[N, K]``.
            bias: optional ``[N]`` float.
        """
        op = "mlx_w8a8.Linear.from_weight"
        if not isinstance(weight, QuantizedWeight):
            raise ValueError(f"[{op}] weight must be a QuantizedWeight, got {describe(weight)}")
        if bias is not None and (
            not isinstance(bias, mx.array) or tuple(bias.shape) != (weight.n,)
        ):
            raise ValueError(
                f"[{op}] bias must be a float array of shape [N] = [{weight.n}], "
                f"got {describe(bias)}"
            )
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        out._init_state()
        out._set_weight(weight)
        if bias is not None:
            out.bias = bias
        out.freeze()
        return out
