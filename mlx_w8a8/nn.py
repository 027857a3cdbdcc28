"""``mlx_w8a8.Linear``: a W8A8 drop-in for ``nn.Linear`` and 8-bit ``nn.QuantizedLinear``.

The hot path is built like MLX's own layers: decide once, run many times. A call at a
new input shape and dtype resolves the kernel (a forced ``layer.kernel``, a tuning-table
entry, a decision borrowed from a nearby measured shape, the built-in prior, or
``mx.quantized_matmul``) into a ready callable that the layer keeps from the shape's
second call on (:mod:`mlx_w8a8.plans`, the one plan path of layers, sibling groups and
``w8a8_linear``); the weight format is a static attribute fixed at construction or
conversion. Anything that can change a decision (a table reload, ``set_tuning_table``, a
recorded measurement, a kernel registered, a new ``layer.kernel``) clears the layer's
plans (``registry.invalidate``), so the next call re-decides.

Layers that receive the same input array (q/k/v projections, gate/up) quantize it once
(:class:`mlx_w8a8.plans.Stages`); linked siblings (:mod:`mlx_w8a8.siblings`) go further
where the kernel allows: one launch computes all of their outputs.
"""

from __future__ import annotations

import math
import numbers

import mlx.core as mx
import mlx.nn as nn

from . import plans as _plans
from . import siblings as _siblings
from .kernels import registry
from .kernels.registry import Problem
from .plans import clear_shared_activations, share_activations
from .weight import (BITS, FLOAT_DTYPES, GROUPED4, QuantizedWeight, check_group_size, describe,
                     dtype_name, zero_code_scales)

# The sharing switches are public here (mlx_w8a8.nn.share_activations); plans owns them.
__all__ = ["Linear", "share_activations", "clear_shared_activations"]

_PARAMETERS = frozenset(("weight", "scales", "biases", "bias"))


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
    ``bits`` and ``group_size``, and so is ``act_scales``: ``"token"`` (one int8 scale
    per token) or ``"group"`` (one per token and weight group, for group-wise weights:
    ``docs/numerics.md``, activation groups).

    ``outliers`` (static too) names input channels kept out of the int8 activations:
    where a W8A8 (W4A8) kernel runs, they are zeroed in ``x`` before it quantizes ``x``
    and their share is added in ``x``'s dtype against the dequantized weight columns
    (``docs/numerics.md``, outlier channels; chosen from calibration data by
    :func:`mlx_w8a8.recipe.recipe`).

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
        act_scales: ``"token"`` (default) or ``"group"``: how the W8A8 (W4A8) kernels
            scale the int8 activations. ``"group"`` quantizes each group of
            ``group_size`` input features of a token with its own scale (closer to the
            W8A16 result where a few channels are large) and needs group-wise weights
            (``per_channel=False``, or ``bits=4``). W8A16 kernels ignore it.
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
        act_scales: str = "token",
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
        self.act_scales = act_scales
        if bias:
            self.bias = mx.zeros((output_dims,))
        self.freeze()

    # --- static configuration -------------------------------------------------------------
    def _init_state(self) -> None:
        # Plain object attributes (not parameters): nn.Module stores dicts as children.
        object.__setattr__(self, "_kernel", None)
        object.__setattr__(self, "_act_scales", "token")
        object.__setattr__(self, "_outliers", None)
        object.__setattr__(self, "_outlier_arrays", {})
        # The layer's plans (plans.PlanCache: watched, so a table reload etc. clears it).
        # _plans and _decisions are its dicts, held here for __call__'s one lookup.
        cache = _plans.PlanCache()
        object.__setattr__(self, "_cache", cache)
        object.__setattr__(self, "_plans", cache.plans)
        object.__setattr__(self, "_decisions", cache.decisions)
        object.__setattr__(self, "_siblings", None)

    def _set_weight(self, qw: QuantizedWeight) -> None:
        if qw.format == "per_channel" and self._act_scales == "group":
            raise ValueError(
                "[mlx_w8a8.Linear] a per-channel weight cannot take act_scales='group' "
                "(activation groups are those of group-wise weights); set "
                "layer.act_scales = 'token' first"
            )
        self.weight, self.scales, self.biases = qw.q, qw.scales, qw.biases
        self.group_size, self.bits, self.mode = qw.group_size, qw.bits, "affine"
        self.format = qw.format
        object.__setattr__(self, "_qw", qw)
        object.__setattr__(self, "_checked", qw.q)
        self._forget()

    def _forget(self) -> None:
        """Drop the layer's plans; its group (whose launches bound this layer's state)
        resets (:meth:`mlx_w8a8.plans.PlanCache._forget`)."""
        self._cache._forget()
        self._outlier_arrays.clear()

    def __setattr__(self, key, value) -> None:
        # nn.Module stores lists, tuples and arrays as children, past any property:
        # outliers given as one goes to its setter all the same.
        if key == "outliers":
            type(self).outliers.fset(self, value)
            return
        super().__setattr__(key, value)

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
    def act_scales(self) -> str:
        """``"token"`` or ``"group"``: one int8 activation scale per token, or per token
        and weight group (``docs/numerics.md``). Setting it re-decides the layer's
        kernels (fewer run activation groups: ``registry.refusal`` says why)."""
        return self._act_scales

    @act_scales.setter
    def act_scales(self, value: str) -> None:
        if value not in registry.ACT_SCALES:
            raise ValueError(
                f"[mlx_w8a8.Linear] act_scales must be one of {registry.ACT_SCALES}, got {value!r}"
            )
        # The weight's format as it is now (arrays loaded since conversion re-detect it).
        if value == "group" and self.quantized_weight.format not in ("grouped", GROUPED4):
            raise ValueError(
                f"[mlx_w8a8.Linear] act_scales='group' needs group-wise weights (format "
                f"'grouped' or '{GROUPED4}'), but this layer's format is {self.format!r}; "
                f"quantize it with per_channel=False"
            )
        object.__setattr__(self, "_act_scales", value)
        self._forget()

    @property
    def outliers(self) -> tuple[int, ...] | None:
        """Input channels kept out of the int8 activations (sorted), or ``None``.

        Where the layer runs a W8A8 (W4A8) kernel, a call computes
        ``kernel(x * m) + x[..., c] @ W[:, c].T`` with ``c`` these channels, ``m`` zero
        on them and one elsewhere and ``W`` the dequantized weight (the second product
        in ``x``'s dtype), so a few channels far larger than the rest no longer set every
        token's int8 scale (``docs/numerics.md``, outlier channels). W8A16 kernels run
        as without it. Setting it re-decides the layer's plans."""
        return self._outliers

    @outliers.setter
    def outliers(self, channels) -> None:
        op = "mlx_w8a8.Linear"
        if channels is not None:
            k = self.input_dims
            try:
                given = [c.item() if isinstance(c, mx.array) else c for c in channels]
            except TypeError:
                given = None
            ok = given is not None and all(
                isinstance(c, numbers.Integral) and not isinstance(c, bool) for c in given)
            chosen = sorted({int(c) for c in given}) if ok else []
            if (not ok or not chosen or len(chosen) != len(given) or chosen[0] < 0
                    or chosen[-1] >= k or len(chosen) > k // 2):
                raise ValueError(
                    f"[{op}] outliers must be None or distinct channel indices in [0, {k}) "
                    f"(input_dims = {k}), at least 1 and at most {k // 2} of them, got "
                    f"{channels!r}"
                )
            channels = tuple(chosen)
        object.__setattr__(self, "_outliers", channels)
        self._forget()

    def _split(self, plan, candidate, dtype: mx.Dtype):
        """``plan`` with the :attr:`outliers` split around it where the layer has some
        and ``candidate`` quantizes activations, else ``plan`` itself (arrays made once
        per dtype and kept until the weight changes).

        Hazard: the dequantized columns are taken when the plan is made; parameters
        replaced through the module (``load_weights``, ``update``, ``set_dtype``) drop
        them with the plans, arrays swapped in without ``__setitem__`` do not (under
        ``mx.compile(inputs=state)`` those hold the same values)."""
        if self._outliers is None or not candidate.w8a8:
            return plan
        arrays = self._outlier_arrays.get(dtype)
        if arrays is None:
            idx = mx.array(self._outliers, dtype=mx.int32)
            mask = mx.ones((self.input_dims,), dtype=dtype)
            mask[idx] = 0
            w_out = mx.take(self.quantized_weight.dequantize(), idx, axis=1).T.astype(dtype)
            mx.eval(mask, w_out)
            arrays = self._outlier_arrays[dtype] = (idx, mask, w_out)
        idx, mask, w_out = arrays
        key = self._outliers

        def split(x):
            # The masked x is shared by the layers fed the same x (q/k/v, gate/up), so
            # their shared quantize and sibling launches still find one input array.
            masked, out = _plans.outlier_split(x, key, idx, mask)
            return mx.addmm(plan(masked), out, w_out)

        return split

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
        self._cache.group = group

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
            self.group_size, "bias" in self, self._act_scales,
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
            dtype_name(dtype), self.format, self.group_size, "bias" in self, self._act_scales,
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
        cache = self._cache
        handed = cache.take(key)
        if handed is not None:  # a sibling planned this call (below)
            return handed
        stamp = registry.generation  # read first: an invalidation while planning keeps nothing
        lead = tuple(x.shape[:-1])
        m = math.prod(lead)
        out_shape = (*lead, n)
        if m == 0:
            dtype = x.dtype
            plan = lambda x: mx.zeros(out_shape, dtype=dtype)  # noqa: E731
            return cache.keep(key, plan, (0, "none", "empty"), stamp)
        found = self._group_decision(m, x.dtype)
        if found is not None:
            candidate, source, members, group_problem = found
            decision = (m, candidate.name, source + "+siblings")
            # Every member takes this shape's group launch: plan it for the members that
            # have no plan for the shape, so their first call at it (right after this
            # one, in a model) checks and decides nothing (a new prompt length's host
            # time, docs/cuda.md "Prompts of new lengths").
            for member in members:
                other = member._cache
                if member is not self and key not in other.plans:
                    handed = _plans.GroupPlan(
                        member, candidate, group_problem, lead, (*lead, member.output_dims),
                        other.met(key)).run
                    other.hand(key, member._split(handed, candidate, x.dtype), decision, stamp)
            plan = _plans.GroupPlan(self, candidate, group_problem, lead, out_shape,
                                    cache.met(key)).run
            return cache.keep(key, self._split(plan, candidate, x.dtype), decision, stamp)
        candidate, source, plan = self._alone_plan(m, x.dtype, lead, out_shape)
        return cache.keep(key, self._split(plan, candidate, x.dtype),
                          (m, candidate.name, source), stamp)

    def _alone_plan(self, m: int, dtype: mx.Dtype, lead, out_shape):
        """``(candidate, source, plan)`` of this layer by itself (no siblings)."""
        problem = self.problem(m, dtype)
        candidate, source = registry.decide(problem, self._kernel)
        return candidate, source, _plans.layer_plan(self, candidate, problem, lead, out_shape)

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
        if self._act_scales != "token":
            text += f", act_scales={self._act_scales!r}"
        if self._outliers is not None:
            text += f", outliers={len(self._outliers)}"
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
        cls, layer: nn.Module, group_size: int = 64, per_channel: bool = True,
        act_scales: str = "token",
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
            act_scales: ``"token"`` or ``"group"`` (group-wise weights only): the
                layer's :attr:`act_scales`.

        Raises:
            ValueError: for other layer types, other bit widths or modes, or
                ``act_scales="group"`` on a per-channel weight.
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
            if qw.format == "grouped":
                # An all-zero group holds w = b whatever its scale (MLX stores -1e-7):
                # scale 0 lets the W8A8 fold b + 128 s give b exactly (zero_code_scales).
                qw = QuantizedWeight(qw.q, zero_code_scales(qw.q, qw.scales, qw.group_size),
                                     qw.biases, qw.group_size, per_channel=False)
        elif isinstance(layer, nn.Linear):
            qw = QuantizedWeight.from_float(layer.weight, group_size, per_channel)
        else:
            raise ValueError(
                f"[{op}] layer must be an nn.Linear or an 8-bit or 4-bit nn.QuantizedLinear, "
                f"got {type(layer).__name__}"
            )
        return cls.from_weight(qw, layer.get("bias") if "bias" in layer else None, act_scales)

    @classmethod
    def from_weight(cls, weight: QuantizedWeight, bias: mx.array | None = None,
                    act_scales: str = "token") -> "Linear":
        """A layer holding ``weight`` (its format is taken from it) and ``bias``.

        Args:
            weight: a :class:`QuantizedWeight` ``[N, K]``.
            bias: optional ``[N]`` float.
            act_scales: the layer's :attr:`act_scales`.
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
        out.act_scales = act_scales
        if bias is not None:
            out.bias = bias
        out.freeze()
        return out
