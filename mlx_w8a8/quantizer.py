"""Whole models to W8A8 in place: :func:`quantize` replaces a model's linear layers by
:class:`mlx_w8a8.Linear`, keeping the layers ``skip`` patterns name on W8A16 or float,
and the model's own choices of layers to leave as they are (:func:`kept_by_model`).

MLX's 4-bit affine layers (mlx-lm's default, format ``"grouped4"``) convert as they are
stored: the :class:`Linear` holds the same arrays. Layer classes without a built-in rule
(MLX's sharded linear layers) convert through :mod:`mlx_w8a8.converters`.
"""

from __future__ import annotations

import fnmatch
import sys
import warnings
from typing import Callable, Iterable, Mapping

import mlx.nn as nn
from mlx.utils import tree_map_with_path

from . import moe, siblings
from .converters import converter_for
from .kernels import registry
from .nn import Linear
from .summary import summary
from .weight import BITS, GROUP_SIZES

KEEP = ("w8a16", "float")


def matches(path: str, pattern: str) -> bool:
    """Whether a layer path matches a skip pattern.

    A pattern matches the path itself, any path ending in ``"." + pattern`` (so
    ``"lm_head"`` or ``"down_proj"`` name those layers wherever they sit), or, as a
    shell glob, the whole path (``"model.layers.0.*"``).
    """
    return path == pattern or path.endswith("." + pattern) or fnmatch.fnmatchcase(path, pattern)


def _skip_table(skip) -> list[tuple[str, str]]:
    if skip is None:
        return []
    if isinstance(skip, str):
        skip = [skip]
    try:
        items = list(skip.items()) if isinstance(skip, Mapping) else [(p, "w8a16") for p in skip]
    except TypeError:  # not iterable
        raise ValueError(
            f"[mlx_w8a8.quantize] skip must be a layer pattern, an iterable of them or a "
            f"mapping of them to one of {KEEP}, got {skip!r} ({type(skip).__name__})"
        ) from None
    for pattern, keep in items:
        if not isinstance(pattern, str) or keep not in KEEP:
            raise ValueError(
                f"[mlx_w8a8.quantize] skip maps layer patterns to one of {KEEP}, got "
                f"{pattern!r}: {keep!r}"
            )
    return items


def _convertible(layer: nn.Module, group_size: int) -> bool:
    registered = converter_for(layer)
    if registered is not None:
        return registered[0](layer, group_size)
    if isinstance(layer, nn.QuantizedLinear):
        return converts_quantized(layer)
    if isinstance(layer, nn.Linear):
        return layer.weight.shape[-1] % group_size == 0
    return False


def converts_quantized(layer: nn.Module) -> bool:
    """Whether the ``nn.QuantizedLinear`` ``layer`` converts to :class:`Linear` as
    stored: MLX's affine layout with 8-bit or 4-bit codes and a group size of
    ``GROUP_SIZES``."""
    return (layer.bits in BITS and getattr(layer, "mode", "affine") == "affine"
            and layer.group_size in GROUP_SIZES)


def kept_by_model(model: nn.Module) -> set[str]:
    """Paths of the linear layers :func:`quantize` leaves as they are by default, for
    what the model says of them: those its ``quant_predicate`` (mlx-lm's hook on a model
    class, ``(path, module) -> bool | dict``, as ``mlx_lm.utils.quantize_model`` calls it)
    returns ``False`` for, and, where the model holds mixture-of-experts layers, its
    routers (:func:`mlx_w8a8.moe.router_layers`) and the layers its ``quant_predicate``
    returns their own settings for (the routers of the MoE classes that define one)."""
    predicate = getattr(model, "quant_predicate", None)
    has_experts = bool(moe.expert_layers(model))
    kept = set(moe.router_layers(model)) if has_experts else set()
    if callable(predicate):
        for path, m in model.named_modules():
            if not isinstance(m, (nn.Linear, nn.QuantizedLinear)):
                continue
            verdict = predicate(path, m)
            if verdict is False or (has_experts and isinstance(verdict, dict)):
                kept.add(path)
    return kept


def _experts_note(model: nn.Module) -> str:
    """What :func:`quantize` says of a mixture-of-experts model, or ``""``."""
    modules = dict(model.named_modules())
    experts = [m for m in modules.values() if moe.is_expert(m)]
    if not experts:
        return ""
    per_layer = "/".join(map(str, sorted({m.weight.shape[0] for m in experts})))
    classes = ", ".join(sorted({type(m).__name__ for m in experts}))
    routers = [p for p in moe.router_layers(model) if not isinstance(modules[p], Linear)]
    return (f"{len(experts)} mixture-of-experts expert layers ({classes}, {per_layer} "
            f"experts each) were left as they are: this version converts dense linear "
            f"layers only (converting experts is later work); {len(routers)} router layers "
            f"were left as they are too (their outputs choose the experts)")


def quantize(
    model: nn.Module,
    class_predicate: Callable[[str, nn.Module], bool] | None = None,
    group_size: int = 64,
    per_channel: bool | None = None,
    skip: Mapping[str, str] | Iterable[str] | None = None,
    kernel: str | None = None,
    verbose: bool = False,
    act_scales: str = "token",
) -> nn.Module:
    """Replace linear layers of ``model`` by :class:`mlx_w8a8.Linear`, in place.

    Like ``nn.quantize``: every ``nn.Linear`` whose K is divisible by ``group_size`` and
    every 8-bit or 4-bit affine ``nn.QuantizedLinear`` (the 4-bit ones keep their arrays
    as they are: W4A8, format ``"grouped4"``) is converted unless ``class_predicate``
    says otherwise (without one, the layers the model's own ``quant_predicate`` leaves
    unquantized, and in a mixture-of-experts model the routers and the layers its
    ``quant_predicate`` gives their own settings, stay as they are: see
    :func:`kept_by_model`); so are MLX's sharded linear layers (``model.shard(group)`` first),
    to the W8A8 sharded layers of :mod:`mlx_w8a8.distributed` (left as they are where
    a ``skip`` pattern matches). Embeddings, norms and other layers are left as they
    are. Layers matching a ``skip`` pattern (see :func:`matches`) stay off W8A8:
    ``"w8a16"`` makes a float layer an 8-bit ``nn.QuantizedLinear`` (mlx-lm's group-wise affine, with
    ``group_size``) and keeps an 8-bit one as it is; ``"float"`` leaves it unchanged.

    Args:
        model: the model (updated in place and returned).
        class_predicate: ``(path, module) -> bool``; converts the layers it accepts
            (each must still be a convertible layer). Default: all convertible ones.
        group_size: 32, 64 or 128 for layers quantized from float.
        per_channel: symmetric per-channel int8 or group-wise affine for layers
            quantized from float; 8-bit layers keep their own weights. Default:
            per-channel, or group-wise with ``act_scales="group"`` (which needs it).
        skip: layer patterns to keep off W8A8: ``{pattern: "w8a16" | "float"}`` (the
            first matching pattern decides), or an iterable of patterns kept on W8A16.
            E.g. ``{"lm_head": "float"}`` or ``["lm_head", "down_proj"]``.
        kernel: force this ``linear`` candidate (e.g. ``"exact"``, ``"mlx_qmm"``) in
            every converted layer (``layer.kernel``); ``None`` lets the tuner decide.
        verbose: print :func:`mlx_w8a8.summary` (which kernel each layer runs at
            decode and prefill, and where each decision came from) to stderr, and the
            float layers left float because group_size does not divide their K.
            A model with mixture-of-experts layers (mlx-lm's ``SwitchLinear``) also
            gets a ``UserWarning``: its experts are not converted by this version.
        act_scales: ``"token"`` (default) or ``"group"``: every converted layer's
            :attr:`mlx_w8a8.Linear.act_scales`. ``"group"`` gives each group of
            ``group_size`` input features of a token its own int8 scale (the layers'
            own group size for converted 8-bit and 4-bit layers), which keeps W8A8
            (W4A8) close to W8A16 (W4A16) where a few activation channels are large
            (``docs/accuracy.md``); group-wise weights only.

    Returns:
        The model, its sibling layers (q/k/v, gate/up) linked
        (:func:`mlx_w8a8.siblings.link`) so each group can run as one launch.

    Raises:
        ValueError: for a bad ``group_size``, ``skip``, ``act_scales``, an unknown
            ``kernel``, or ``per_channel=True`` with ``act_scales="group"``; or when
            ``act_scales="group"`` meets a layer stored per channel (nothing is
            converted then).
    """
    if group_size not in GROUP_SIZES:
        raise ValueError(
            f"[mlx_w8a8.quantize] group_size must be one of {GROUP_SIZES}, got {group_size!r}"
        )
    if act_scales not in registry.ACT_SCALES:
        raise ValueError(
            f"[mlx_w8a8.quantize] act_scales must be one of {registry.ACT_SCALES}, got "
            f"{act_scales!r}"
        )
    if per_channel is None:
        per_channel = act_scales == "token"
    elif per_channel and act_scales == "group":
        raise ValueError(
            "[mlx_w8a8.quantize] act_scales='group' needs group-wise weights, got "
            "per_channel=True; pass per_channel=False (or leave it out)"
        )
    if kernel is not None:
        registry.get("linear", kernel)  # unknown: ValueError naming the known kernels

    table = _skip_table(skip)
    left_as_is = kept_by_model(model) if class_predicate is None else set()

    def convert(path, layer):
        if not _convertible(layer, group_size):
            return layer
        if class_predicate is not None and not class_predicate(path, layer):
            return layer
        if path in left_as_is:
            return layer
        keep = next((k for pattern, k in table if matches(path, pattern)), None)
        registered = converter_for(layer)  # MLX's sharded layers: registered by distributed
        if registered is not None:  # a layer a skip pattern matches stays as it is
            if keep:
                return layer
            made.append((path, registered[1](layer, group_size, per_channel)))
            return made[-1][1]
        if keep == "float" or (keep == "w8a16" and isinstance(layer, nn.QuantizedLinear)):
            return layer
        if keep == "w8a16":
            return nn.QuantizedLinear.from_linear(layer, group_size=group_size, bits=8)
        out = Linear.from_linear(layer, group_size=group_size, per_channel=per_channel)
        out.kernel = kernel
        made.append((path, out))
        return out

    made: list[tuple[str, nn.Module]] = []  # (path, the new layer) of every conversion

    leaves = tree_map_with_path(convert, model.leaf_modules(), is_leaf=nn.Module.is_module)
    if act_scales == "group":
        # Set on the converted layers before any enters the model: a layer stored per
        # channel (an mlx_w8a8 checkpoint's) has no groups to scale by, and then nothing
        # was converted.
        set_act_scales("mlx_w8a8.quantize", [(p, m) for p, m in made if isinstance(m, Linear)],
                       "group", "; nothing was converted")
    model.update_modules(leaves)
    left = sorted(
        {f"{m.bits}-bit {getattr(m, 'mode', 'affine')}" for _, m in model.named_modules()
         if isinstance(m, nn.QuantizedLinear) and not converts_quantized(m)}
    )
    if left:
        warnings.warn(
            f"[mlx_w8a8.quantize] the model holds {', '.join(left)} QuantizedLinear layers; "
            f"only float and 8-bit or 4-bit affine layers (group size one of {GROUP_SIZES}) "
            f"convert, those were left as they are",
            stacklevel=2,
        )
    experts = _experts_note(model)
    if experts:
        warnings.warn(f"[mlx_w8a8.quantize] {experts}", stacklevel=2)
    siblings.link(model)  # q/k/v, gate/up: one launch where a kernel allows
    if verbose:
        print(summary(model), file=sys.stderr)
        # Float layers that stayed float for their K (not convertible, so never touched).
        uneven = [path for path, m in model.named_modules()
                  if type(m) is nn.Linear and m.weight.shape[-1] % group_size]
        if uneven:
            print(f"mlx_w8a8: {len(uneven)} nn.Linear layers kept float, their K not a multiple "
                  f"of group_size {group_size}: {', '.join(sorted(uneven))}", file=sys.stderr)
    return model


def set_act_scales(op: str, layers: list[tuple[str, Linear]], act_scales: str,
                   consequence: str = "") -> None:
    """Set ``act_scales`` on every ``(path, layer)`` of ``layers``, or on none of them.

    Raises:
        ValueError: naming ``op``, when ``act_scales`` is ``"group"`` and some layers hold
            per-channel weights (how many, and the first one's path).
    """
    flat = [p for p, m in layers if act_scales == "group" and m.quantized_weight.per_channel]
    if flat:
        raise ValueError(
            f"[{op}] act_scales='group' needs group-wise weights, but {len(flat)} layer(s) "
            f"hold per-channel weights (e.g. {flat[0]}){consequence}"
        )
    for _, m in layers:
        m.act_scales = act_scales


def w8a8_layers(model: nn.Module) -> dict[str, dict]:
    """``{path: {"group_size": g, "format": "per_channel" | "grouped"}}`` of the
    model's :class:`Linear` layers; a 4-bit layer's entry is ``{"group_size": g,
    "format": "grouped4", "bits": 4}``, a layer with activation groups adds
    ``"act_scales": "group"`` and one with outlier channels ``"outliers": [c, ...]``."""
    out = {}
    for path, m in model.named_modules():
        if isinstance(m, Linear):
            out[path] = {"group_size": m.group_size, "format": m.quantized_weight.format}
            if m.bits != 8:
                out[path]["bits"] = m.bits
            if m.act_scales != "token":
                out[path]["act_scales"] = m.act_scales
            if m.outliers is not None:
                out[path]["outliers"] = list(m.outliers)
    return out

