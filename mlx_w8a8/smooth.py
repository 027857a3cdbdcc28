"""SmoothQuant: move activation outliers into the weights before W8A8 quantization.

Per-token int8 activations lose precision when a few input channels are far larger than
the rest. For a linear layer ``y = x W^T`` and any positive ``s`` over input channels,
``y = (x / s) (W * s)^T``; SmoothQuant (Xiao et al., 2023) picks

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)

(``max|W_j|`` over every weight row that reads channel ``j``) and folds ``1 / s`` into the
operation that produces ``x``, so the float model computes the same function with no
extra op at run time. The pairs folded here, per transformer block:

- ``input_layernorm`` -> ``q_proj``, ``k_proj``, ``v_proj`` (norm weight / s),
- ``post_attention_layernorm`` (Gemma-3: ``pre_feedforward_layernorm``) -> ``gate_proj``,
  ``up_proj`` (norm weight / s; Gemma's norms scale by ``1 + w``, so ``1 + w`` is divided),
- ``up_proj`` -> ``down_proj`` (``act(gate) * up`` is linear in ``up``: rows / s),
- ``v_proj`` -> ``o_proj`` (attention mixes tokens, not channels, so value channel
  ``(kv head, d)`` reaches ``o_proj`` input ``(h, d)`` for each query head ``h`` sharing
  that KV head; ``s`` is shared across those heads).

Supported: the mlx-lm families Llama (and Mistral, which mlx-lm runs as Llama), Qwen2 /
Qwen2.5, Qwen3 and Gemma-3 text models (``gemma3_text``).
"""

from __future__ import annotations

from typing import Mapping

import attrs
import mlx.core as mx
import mlx.nn as nn

from .calibrate import LayerStats

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
PAIRS = ("attn_in", "mlp_in", "down", "o")
_MODULES = {"mlx_lm.models.llama", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3",
            "mlx_lm.models.gemma3_text"}
# Norms that scale by ``1 + weight`` (Gemma's RMSNorm) rather than by ``weight``.
_ONE_PLUS_NORMS = {("mlx_lm.models.gemma3_text", "RMSNorm")}


@attrs.frozen
class Group:
    """One smoothing site: ``prev`` produces the shared input of ``linears``.

    Attributes:
        pair: which of :data:`PAIRS` it is.
        prev: path of the producer (a norm, ``up_proj`` or ``v_proj``).
        linears: paths of the consumers, which read that input.
        repeats: for ``o``: query heads per KV head (``s`` is shared across them);
            1 elsewhere.
    """

    pair: str
    prev: str
    linears: tuple[str, ...]
    repeats: int = 1


def family(model: nn.Module) -> str:
    """The model's family (one of :data:`FAMILIES`).

    Raises:
        ValueError: for any other model.
    """
    model_type = getattr(model, "model_type", None)
    if model_type is None:
        model_type = getattr(getattr(model, "args", None), "model_type", None)
    module = type(model).__module__
    if model_type in FAMILIES and module in _MODULES:
        return model_type
    raise ValueError(
        f"[mlx_w8a8.smooth] supported models are mlx-lm's {', '.join(FAMILIES)} (model_type "
        f"and class from mlx_lm.models.llama / qwen2 / qwen3 / gemma3_text); got model_type "
        f"{model_type!r} of class {module}.{type(model).__name__}"
    )


def groups(model: nn.Module, pairs=PAIRS) -> list[Group]:
    """The smoothing sites of a supported model.

    Args:
        model: an mlx-lm Llama / Mistral / Qwen2 / Qwen3 / Gemma-3 text model.
        pairs: which kinds of site (default: all of :data:`PAIRS`).

    Raises:
        ValueError: for an unsupported model or an unknown pair name.
    """
    mlp_norm = "pre_feedforward_layernorm" if family(model) == "gemma3_text" else "post_attention_layernorm"
    unknown = [p for p in pairs if p not in PAIRS]
    if unknown:
        raise ValueError(f"[mlx_w8a8.smooth] pairs must be among {PAIRS}, got {unknown}")
    out = []
    for i, block in enumerate(model.model.layers):
        pre = f"model.layers.{i}"
        attn = block.self_attn
        if "attn_in" in pairs:
            out.append(Group("attn_in", f"{pre}.input_layernorm", tuple(
                f"{pre}.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj"))))
        if "mlp_in" in pairs:
            out.append(Group("mlp_in", f"{pre}.{mlp_norm}", tuple(
                f"{pre}.mlp.{n}" for n in ("gate_proj", "up_proj"))))
        if "down" in pairs:
            out.append(Group("down", f"{pre}.mlp.up_proj", (f"{pre}.mlp.down_proj",)))
        if "o" in pairs and attn.n_heads % attn.n_kv_heads == 0:
            out.append(Group("o", f"{pre}.self_attn.v_proj", (f"{pre}.self_attn.o_proj",),
                             attn.n_heads // attn.n_kv_heads))
    return out


def _module(model: nn.Module, path: str) -> nn.Module:
    m = model
    for part in path.split("."):
        m = m[int(part)] if isinstance(m, list) else m[part]
    return m


def _float_weight(path: str, layer: nn.Module) -> mx.array:
    if type(layer) is not nn.Linear:
        raise ValueError(
            f"[mlx_w8a8.smooth] {path} is a {type(layer).__name__}; smooth the float model "
            f"before quantizing it (every smoothed layer must be an nn.Linear)"
        )
    return layer.weight


def factors(act_absmax: mx.array, weight_absmax: mx.array, alpha: float) -> mx.array:
    """``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``.

    Args:
        act_absmax: ``[K]`` per-input-channel activation maxima.
        weight_absmax: ``[K]`` per-input-channel weight maxima (over every consumer).
        alpha: migration strength in [0, 1].

    Returns:
        ``[K]`` float32; channels never seen (``max|X_j| = 0``) or with an all-zero
        weight column get 1, and no factor is below 1e-5.
    """
    a = act_absmax.astype(mx.float32)
    w = weight_absmax.astype(mx.float32)
    valid = (a > 0) & (w > 0)
    s = mx.power(mx.where(valid, a, 1.0), alpha) / mx.power(mx.where(valid, w, 1.0), 1 - alpha)
    return mx.where(valid, mx.maximum(s, 1e-5), 1.0)


def _tied_factors(a, w, alpha, repeats, head_dim):
    """``[n_kv * head_dim]`` shared factors from ``[n_heads * head_dim]`` maxima."""
    k = a.shape[0]
    kv = k // (repeats * head_dim)
    a3 = a.reshape(kv, repeats, head_dim).max(axis=1).reshape(-1)
    w3 = w.reshape(kv, repeats, head_dim).max(axis=1).reshape(-1)
    return factors(a3, w3, alpha)


def site_factors(
    model: nn.Module, g: Group, stats: Mapping[str, LayerStats], alpha: float
) -> tuple[mx.array, mx.array]:
    """The factors of one site: ``(s for the producer's outputs, s for the consumers'
    input columns)`` (equal except at ``o``, where the ``[n_kv * head_dim]`` producer
    factors repeat over the query heads of each KV head).

    Raises:
        ValueError: when ``stats`` lacks a consumer or a consumer is not a float layer.
    """
    missing = [p for p in g.linears if p not in stats]
    if missing:
        raise ValueError(
            f"[mlx_w8a8.smooth] no calibration statistics for {missing}; run "
            f"mlx_w8a8.calibrate on this model (before smoothing it) first"
        )
    weights = [_float_weight(p, _module(model, p)) for p in g.linears]
    act = stats[g.linears[0]].absmax
    for p in g.linears[1:]:
        act = mx.maximum(act, stats[p].absmax)
    wmax = weights[0].astype(mx.float32).abs().max(axis=0)
    for w in weights[1:]:
        wmax = mx.maximum(wmax, w.astype(mx.float32).abs().max(axis=0))
    if g.pair == "o":
        attn = _module(model, g.prev.rsplit(".", 1)[0])
        head_dim = act.shape[0] // attn.n_heads
        s_kv = _tied_factors(act, wmax, alpha, g.repeats, head_dim)  # v_proj rows
        return s_kv, mx.repeat(s_kv.reshape(-1, 1, head_dim), g.repeats, axis=1).reshape(-1)
    s = factors(act, wmax, alpha)
    return s, s


def smooth(
    model: nn.Module,
    stats: Mapping[str, LayerStats],
    alpha: float | Mapping[str, float | None] = 0.5,
    pairs=PAIRS,
) -> dict[str, mx.array]:
    """Fold SmoothQuant factors into a float model, in place.

    The model computes the same function afterwards (up to the rounding of the updated
    weights to their dtype); its linear layers see inputs whose outlier channels were
    moved into the weights, which per-token int8 activations quantize better.

    Args:
        model: an mlx-lm Llama / Mistral / Qwen2 / Qwen3 / Gemma-3 text model with
            float linear layers.
        stats: :func:`mlx_w8a8.calibrate` of this model (the consumers' ``absmax``).
        alpha: migration strength in [0, 1]: at 1 every input channel's maximum
            becomes 1 (activations fully flattened), at 0 every weight column's
            maximum does. Default: ``0.5``; llm-compressor's W8A8 recipes use 0.7-0.85.
            A mapping ``{producer path: alpha or None}`` sets it per site (a site
            missing from it, or mapped to ``None``, is left as it is); see
            :mod:`mlx_w8a8.recipe`, which chooses them.
        pairs: which sites to smooth (:data:`PAIRS`; default: all).

    Returns:
        ``{producer path: s}``: the ``[K]`` float32 factor applied at each site.

    Raises:
        ValueError: for unsupported models, quantized layers, a bad alpha, or stats
            missing a consumer.
    """
    per_site = alpha if isinstance(alpha, Mapping) else None
    for a in (per_site.values() if per_site is not None else [alpha]):
        if a is not None and not (isinstance(a, (int, float)) and 0.0 <= float(a) <= 1.0):
            raise ValueError(f"[mlx_w8a8.smooth] alpha must be in [0, 1], got {a!r}")
    applied = {}
    for g in groups(model, pairs):
        a = alpha if per_site is None else per_site.get(g.prev)
        if a is None:
            continue
        s_kv, s_in = site_factors(model, g, stats, a)
        consumers = [_module(model, p) for p in g.linears]
        weights = [m.weight for m in consumers]
        _divide_output(g.prev, _module(model, g.prev), s_kv)
        for m, w in zip(consumers, weights):
            m.weight = (w.astype(mx.float32) * s_in[None, :]).astype(w.dtype)
        mx.eval(model.parameters())
        applied[g.prev] = s_kv
    return applied


def _divide_output(path: str, prev: nn.Module, s: mx.array) -> None:
    """Make ``prev``'s output ``out / s`` (per output channel)."""
    def div(a):
        return (a.astype(mx.float32) / s.reshape((-1,) + (1,) * (a.ndim - 1))).astype(a.dtype)

    if (type(prev).__module__, type(prev).__name__) in _ONE_PLUS_NORMS:  # scales by 1 + w
        w = prev.weight
        prev.weight = ((1.0 + w.astype(mx.float32)) / s - 1.0).astype(w.dtype)
        return
    if isinstance(prev, (nn.RMSNorm, nn.LayerNorm)):
        if "weight" not in prev:
            raise ValueError(
                f"[mlx_w8a8.smooth] {path} is a {type(prev).__name__} without a weight; "
                f"there is nothing to fold the factors into"
            )
        prev.weight = div(prev.weight)
        if "bias" in prev:
            prev.bias = div(prev.bias)
        return
    weight = _float_weight(path, prev)
    prev.weight = div(weight)
    if "bias" in prev:
        prev.bias = div(prev.bias)
