"""The distinct linear problems of a model: what ``tune --model`` and ``tune_model``
measure.

Walks a model's ``nn.Linear``, 8-bit and 4-bit affine ``nn.QuantizedLinear`` and
``mlx_w8a8.Linear`` layers and groups them by what a tuning-table entry is keyed on:
(N, K, weight format, group size, bias, activation dtype). ``nn.Linear`` layers are
described as :func:`mlx_w8a8.quantize` would convert them (``weight_format``,
``group_size``); converted and 8-bit layers keep their own format and group size.
"""

from __future__ import annotations

import attrs
import mlx.nn as nn

from .. import siblings
from ..kernels import registry
from ..kernels.registry import Problem
from ..weight import GROUP_SIZES, GROUPED4, QuantizedWeight
from . import shapes

OP = "mlx_w8a8.tune_model"
DTYPES = ("bfloat16", "float16", "float32")
FORMATS = ("per_channel", "grouped", GROUPED4)


@attrs.frozen
class LinearShape:
    """One distinct linear shape of a model and the layers that have it.

    Args:
        n, k: output and input features (per rank under tensor parallelism).
        dtype: the activation dtype name.
        weight_format: ``"per_channel"``, ``"grouped"`` or ``"grouped4"``.
        group_size: the weight's group size.
        has_bias: whether the layers add a bias.
        paths: the layers' paths in the model (e.g. ``model.layers.0.mlp.up_proj``).
        act_scales: ``Problem.act_scales`` of the layers.
    """

    n: int
    k: int
    dtype: str
    weight_format: str
    group_size: int
    has_bias: bool
    paths: tuple[str, ...] = ()
    act_scales: str = "token"

    def problem(self, m: int) -> Problem:
        """The ``linear`` problem of this shape at ``m`` tokens."""
        return Problem("linear", int(m), self.n, self.k, self.dtype, self.weight_format,
                       self.group_size, self.has_bias, self.act_scales)

    def key(self) -> tuple:
        return (self.n, self.k, self.weight_format, self.group_size, self.has_bias, self.dtype,
                self.act_scales)


def w8a8_linears(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(path, layer)`` of every ``mlx_w8a8.Linear`` of ``model`` (subclasses, such as
    the sharded layers, included), in module order: the layers the model checks time."""
    from ..nn import Linear

    return [(path, m) for path, m in model.named_modules() if isinstance(m, Linear)]


def _quantized_format(layer: nn.Module) -> str:
    """The weight format of an 8-bit or 4-bit layer, from its parameters (one host read
    for 8 bits)."""
    fmt = getattr(layer, "weight_format", None)
    if fmt in FORMATS:
        return fmt
    if layer.bits == 4:
        return GROUPED4
    return QuantizedWeight(layer.weight, layer.scales, layer.biases, layer.group_size).format


def describe(
    layer: nn.Module, weight_format: str = "per_channel", group_size: int = 64
) -> tuple[int, int, str, int, bool] | str:
    """``(N, K, format, group_size, has_bias)`` of one layer, or why it is not tuned.

    Args:
        layer: any module.
        weight_format, group_size: how an ``nn.Linear`` would be converted.
    """
    from ..nn import Linear  # a model module; imported late (it imports the ops)

    has_bias = "bias" in layer
    if isinstance(layer, (Linear, nn.QuantizedLinear)):
        if isinstance(layer, nn.QuantizedLinear) and (
            layer.bits not in (4, 8) or getattr(layer, "mode", "affine") != "affine"
            or layer.group_size not in GROUP_SIZES
        ):
            return f"{layer.bits}-bit {getattr(layer, 'mode', 'affine')} QuantizedLinear (not converted)"
        n, k = layer.weight.shape[0], layer.weight.shape[1] * 32 // layer.bits  # codes per uint32
        return n, k, _quantized_format(layer), int(layer.group_size), has_bias
    if isinstance(layer, nn.Linear):
        n, k = layer.weight.shape
        if k % group_size:
            return f"K = {k} not divisible by group size {group_size} (not converted)"
        return n, k, weight_format, group_size, has_bias
    return f"{type(layer).__name__} (not a linear layer)"


def model_shapes(
    model: nn.Module,
    dtype: str = "bfloat16",
    weight_format: str = "per_channel",
    group_size: int = 64,
    tp: int = 1,
    sibling_sums: bool = True,
    act_scales: str = "token",
) -> tuple[list[LinearShape], list[tuple[str, str]]]:
    """The distinct linear shapes of ``model``.

    Args:
        model: an ``nn.Module`` (e.g. an mlx-lm model, before or after
            :func:`mlx_w8a8.quantize`). Parameters are read for shapes only (except an
            8-bit layer's format: one host read of its scales).
        dtype: the activation dtype the model runs in.
        weight_format, group_size: the conversion of ``nn.Linear`` layers (as
            :func:`mlx_w8a8.quantize`'s ``per_channel`` and ``group_size``).
        tp: tensor-parallel ranks: column-parallel projections (q/k/v, gate/up) are
            measured at ``N / tp``, row-parallel ones (o, down) at ``K / tp``
            (:func:`shapes.split_for_tp`).
        sibling_sums: also list each sibling group's summed shape (what a kernel with a
            multi-weight form runs as one launch; :func:`group_launch_available`).
        act_scales: the activation scaling of every shape (``"group"``: as
            :func:`mlx_w8a8.quantize` with ``act_scales="group"`` converts; every shape
            must then be group-wise).

    Returns:
        ``(shapes, skipped)``: the shapes in model order (with the summed shape of each
        sibling group, :mod:`mlx_w8a8.siblings`, labelled ``path.q_proj+k_proj+v_proj``),
        and ``(path, reason)`` for linear-like layers that are not converted (other bit widths, K not divisible
        by the group size).

    Raises:
        ValueError: for an unknown dtype, format or group size, or a shape that
            ``tp`` does not divide.
    """
    if dtype not in DTYPES:
        raise ValueError(f"[{OP}] dtype must be one of {DTYPES}, got {dtype!r}")
    if weight_format not in FORMATS:
        raise ValueError(f"[{OP}] weight_format must be one of {FORMATS}, got {weight_format!r}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"[{OP}] group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    found: dict[tuple, list[str]] = {}
    skipped: list[tuple[str, str]] = []
    for path, layer in model.named_modules():
        if not isinstance(layer, nn.Module) or not hasattr(layer, "weight"):
            continue
        spec = describe(layer, weight_format, group_size)
        if isinstance(spec, str):
            if "not a linear layer" not in spec:
                skipped.append((path, spec))
            continue
        n, k, fmt, g, bias = spec
        n, k = shapes.split_for_tp(path.rsplit(".", 1)[-1], n, k, tp)
        if k % g:
            skipped.append((path, f"K / tp = {k} not divisible by group size {g}"))
            continue
        found.setdefault((n, k, fmt, g, bias, dtype), []).append(path)
    # Sibling groups (q/k/v, gate/up: mlx_w8a8.siblings) run as one launch of their summed
    # N where the kernel chosen for that shape has a multi-weight form: measure it too.
    for path, names, children in siblings.named_groups(model) if sibling_sums else ():
        specs = [describe(child, weight_format, group_size) if isinstance(child, nn.Module)
                 else "not a module" for child in children]
        if any(isinstance(s, str) for s in specs) or len({s[1:] for s in specs}) != 1:
            continue
        split = [shapes.split_for_tp(name, s[0], s[1], tp) for name, s in zip(names, specs)]
        n, k = sum(ns for ns, _ in split), split[0][1]
        _, _, fmt, g, bias = specs[0]
        if k % g == 0:
            label = f"{path}.{'+'.join(names)}" if path else "+".join(names)
            found.setdefault((n, k, fmt, g, bias, dtype), []).append(label)
    # a stable, model-ordered listing (by the first layer that has each shape)
    out = [
        LinearShape(n, k, dt, fmt, g, bias, tuple(sorted(paths, key=_path_order)), act_scales)
        for (n, k, fmt, g, bias, dt), paths in found.items()
    ]
    out.sort(key=lambda s: _path_order(s.paths[0]))
    flat = [s for s in out if act_scales == "group" and s.weight_format == "per_channel"]
    if flat:
        raise ValueError(
            f"[{OP}] act_scales='group' needs group-wise weights, but {len(flat)} shape(s) "
            f"are per-channel (e.g. {flat[0].paths[0]}); use weight_format 'grouped'"
        )
    return out, sorted(skipped, key=lambda s: _path_order(s[0]))


def group_launch_available() -> bool:
    """Whether a ``linear`` kernel that can run here has a multi-weight form
    (``Candidate.bind_group``): only then do sibling groups run as one launch, so only then
    are their summed shapes worth measuring."""
    return any(c.op == "linear" and c.bind_group is not None and c.available()
               for c in registry.all_candidates())


def _path_order(path: str) -> tuple:
    """Model order: by the first layer index in the path (``model.layers.3...``), layers
    without one (``lm_head``) last, then by name."""
    index = next((int(p) for p in path.split(".") if p.isdigit()), float("inf"))
    return (index, path)


def problems(shape_list: list[LinearShape], m_values) -> list[Problem]:
    """Every shape crossed with every token count in ``m_values``, shape by shape."""
    return [s.problem(m) for s in shape_list for m in m_values]
