"""The registry of layer converters: how :func:`mlx_w8a8.quantize` converts layer classes
it has no built-in rule for.

Modules that define such layers register them when they are imported
(:mod:`mlx_w8a8.distributed` registers MLX's sharded linear classes, and the package
imports it, so they are in place before any ``quantize`` call). This module imports none
of them: a registering module imports this one, never the other way round.
"""

from __future__ import annotations

from typing import Callable

import mlx.nn as nn

# Converters of layer classes, by class: ``(convertible, convert)`` (see
# :func:`register_converter`).
_CONVERTERS: dict[type, tuple[Callable, Callable]] = {}


def register_converter(layer_type: type, convertible: Callable[[nn.Module, int], bool],
                       convert: Callable[[nn.Module, int, bool], nn.Module]) -> None:
    """Make :func:`mlx_w8a8.quantize` convert layers of ``layer_type`` (and its
    subclasses) with ``convert``, where ``convertible`` accepts them.

    A registered class is looked up before the built-in ``nn.Linear`` /
    ``nn.QuantizedLinear`` rules, so a subclass of those can be handled its own way. A
    layer that a ``skip`` pattern matches stays as it is. Registering a class again
    replaces its converter.

    Args:
        layer_type: the layer class.
        convertible: ``(layer, group_size) -> bool``: whether ``convert`` can convert
            this layer with this group size (``False``: the layer is left as it is).
        convert: ``(layer, group_size, per_channel) -> nn.Module``: the W8A8 layer.

    Raises:
        ValueError: when ``layer_type`` is not a class or a converter is not callable.
    """
    if not isinstance(layer_type, type):
        raise ValueError(
            f"[mlx_w8a8.register_converter] layer_type must be a class, got {layer_type!r}"
        )
    for name, fn in (("convertible", convertible), ("convert", convert)):
        if not callable(fn):
            raise ValueError(
                f"[mlx_w8a8.register_converter] {name} must be callable, got {fn!r}"
            )
    _CONVERTERS[layer_type] = (convertible, convert)


def converter_for(layer: nn.Module) -> tuple[Callable, Callable] | None:
    """The registered ``(convertible, convert)`` of the nearest class of ``layer`` (along
    its method resolution order), or ``None``."""
    for cls in type(layer).__mro__:
        found = _CONVERTERS.get(cls)
        if found is not None:
            return found
    return None
