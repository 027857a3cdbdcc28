"""Calibration: what the inputs of a model's linear layers look like on real tokens.

``calibrate(model, batches)`` runs float forward passes and keeps, per linear layer, the
per-input-channel absolute maximum of its input (SmoothQuant's ``max|X_j|``) as a running
reduction, so memory does not grow with the number of batches. Hooks see every input of
every observed layer during the same passes (the sensitivity report uses one).
"""

from __future__ import annotations

from typing import Callable, Iterable

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from .nn import Linear

# (path, layer, x) -> arrays the hook updated (evaluated after each batch), or None.
Hook = Callable[[str, nn.Module, mx.array], "Iterable[mx.array] | None"]


def is_linear(module: nn.Module) -> bool:
    """``nn.Linear``, ``nn.QuantizedLinear`` or :class:`mlx_w8a8.Linear`."""
    return isinstance(module, (nn.Linear, nn.QuantizedLinear, Linear))


def linear_layers(model: nn.Module) -> dict[str, nn.Module]:
    """``{path: layer}`` of the model's linear layers, in model order."""
    leaves = tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
    return {path: m for path, m in leaves if is_linear(m)}


@attrs.define
class LayerStats:
    """Running statistics of one linear layer's input.

    Attributes:
        absmax: ``[K]`` float32, ``max |x_j|`` over every token seen.
        tokens: how many tokens (rows of the input) were seen.
    """

    absmax: mx.array
    tokens: int = 0


class _Observed(nn.Module):
    """Calls ``hook(path, layer, x)`` then the wrapped layer (calibration only)."""

    def __init__(self, path: str, layer: nn.Module, hook: Callable):
        super().__init__()
        self.layer = layer
        self._path, self._hook = path, hook

    def __call__(self, x: mx.array) -> mx.array:
        self._hook(self._path, self.layer, x)
        return self.layer(x)


def observe(
    model: nn.Module,
    batches: Iterable[mx.array],
    hook: Hook,
    layers: Iterable[str] | None = None,
    progress: str | None = None,
) -> int:
    """Run ``model`` on each batch with ``hook`` seeing the input of each linear layer.

    The layers are wrapped for the duration of the call and put back afterwards (also
    on error). After each batch the arrays the hook returned are evaluated, so running
    reductions stay small graphs.

    Args:
        model: the model; called as ``model(batch)``.
        batches: ``[B, T]`` token arrays (or whatever the model takes).
        hook: ``hook(path, layer, x)``; returns the arrays it updated, or ``None``.
        layers: the paths to observe (default: every linear layer).
        progress: a tqdm description to show a progress bar, or ``None``.

    Returns:
        The number of batches run.
    """
    found = linear_layers(model)
    paths = list(found) if layers is None else list(layers)
    missing = [p for p in paths if p not in found]
    if missing:
        raise ValueError(
            f"[mlx_w8a8.calibrate] {missing[:3]} are not linear layers of the model "
            f"(it has {len(found)}, e.g. {list(found)[:3]})"
        )
    pending: list[mx.array] = []

    def record(path, layer, x):
        out = hook(path, layer, x)
        if out is not None:
            pending.extend(out)

    originals = [(p, found[p]) for p in paths]
    model.update_modules(tree_unflatten([(p, _Observed(p, m, record)) for p, m in originals]))
    count = 0
    try:
        if progress is not None:
            from tqdm import tqdm

            batches = tqdm(batches, desc=progress, unit="batch")
        for batch in batches:
            model(batch)  # only the observed inputs are needed: the hook's arrays say which
            mx.eval(pending)
            pending.clear()
            count += 1
    finally:
        model.update_modules(tree_unflatten(originals))
    return count


def calibrate(
    model: nn.Module,
    batches: Iterable[mx.array],
    layers: Iterable[str] | None = None,
    hooks: Iterable[Hook] = (),
    progress: bool = False,
) -> dict[str, LayerStats]:
    """Per-input-channel absolute maxima of every linear layer's input.

    Args:
        model: a float model (an mlx-lm model or any ``nn.Module`` called as
            ``model(batch)``); it is not changed.
        batches: token batches, e.g. from :func:`mlx_w8a8.tokens.batches`.
        layers: the paths to observe (default: every linear layer).
        hooks: more ``(path, layer, x)`` observers run in the same passes.
        progress: show a tqdm progress bar.

    Returns:
        ``{path: LayerStats}``; ``absmax`` is ``[K]`` float32.

    Raises:
        ValueError: when ``batches`` is empty or a path is not a linear layer.
    """
    stats: dict[str, LayerStats] = {}
    extra = list(hooks)

    def hook(path, layer, x):
        amax = mx.max(mx.abs(x.astype(mx.float32)).reshape(-1, x.shape[-1]), axis=0)
        entry = stats.get(path)
        if entry is None:
            entry = stats[path] = LayerStats(amax, 0)
        else:
            entry.absmax = mx.maximum(entry.absmax, amax)
        entry.tokens += x.size // x.shape[-1]
        out = [entry.absmax]
        for h in extra:
            out.extend(h(path, layer, x) or ())
        return out

    count = observe(model, batches, hook, layers, "calibrate" if progress else None)
    if count == 0:
        raise ValueError("[mlx_w8a8.calibrate] batches is empty; give at least one batch")
    return stats
