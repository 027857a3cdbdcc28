"""SmoothQuant: move activation outliers into the weights before W8A8 quantization.

Per-token int8 activations lose precision when a few input channels are far larger than
the rest. For a linear layer ``y = x W^T`` and any positive ``s`` over input channels,
``y = (x / s) (W * s)^T``; SmoothQuant (Xiao et al., 2023) picks

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)

(``max|W_j|`` over every weight row that reads channel ``j``) and folds ``1 / s`` into the
operation that produces ``x``, so the float model computes the same function with no
extra op at run time. The pairs folded here, per transformer block:

- ``input_layernorm`` -> ``q_proj``, ``k_proj``, ``v_proj`` (norm weight / s),
- ``post_attention_layernorm`` -> ``gate_proj``, ``up_proj`` (norm weight / s),
- ``up_proj`` -> ``down_proj`` (the SwiGLU product is linear in ``up``: rows / s),
- ``v_proj`` -> ``o_proj`` (attention mixes tokens, not channels, so value channel
  ``(kv head, d)`` reaches ``o_proj`` input ``(h, d)`` for each query head ``h`` sharing
  that KV head; ``s`` is shared across those heads).

Supported: the mlx-lm families Llama (and Mistral, which mlx-lm runs as Llama), Qwen2 /
Qwen2.5 and Qwen3.
"""

from __future__ import annotations

from typing import Mapping

import attrs
import mlx.core as mx
import mlx.nn as nn

from .calibrate import LayerStats

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
PAIRS = ("attn_in", "mlp_in", "down", "o")
_MODULES = {"mlx_lm.models.llama", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3"}


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
        f"and class from mlx_lm.models.llama / qwen2 / qwen3); got model_type "
        f"{model_type!r} of class {module}.{type(model).__name__}"
    )


def groups(model: nn.Module, pairs=PAIRS) -> list[Group]:
    """The smoothing sites of a supported model.

    Args:
        model: an mlx-lm Llama / Mistral / Qwen2 / Qwen3 model.
        pairs: which kinds of site (default: all of :data:`PAIRS`).

    Raises:
        ValueError: for an unsupported model or an unknown pair name.
    """
    family(model)
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
            out.append(Group("mlp_in", f"{pre}.post_attention_layernorm", tuple(
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


def smooth(
    model: nn.Module,
    stats: Mapping[str, LayerStats],
    alpha: float = 0.5,
    pairs=PAIRS,
) -> dict[str, mx.array]:
    """Fold SmoothQuant factors into a float model, in place.

    The model computes the same function afterwards (up to the rounding of the updated
    weights to their dtype); its linear layers see inputs whose outlier channels were
    moved into the weights, which per-token int8 activations quantize better.

    Args:
        model: an mlx-lm Llama / Mistral / Qwen2 / Qwen3 model with float linear layers.
        stats: :func:`mlx_w8a8.calibrate` of this model (the consumers' ``absmax``).
        alpha: migration strength in [0, 1]: at 1 every input channel's maximum
            becomes 1 (activations fully flattened), at 0 every weight column's
            maximum does. Default: ``0.5``; llm-compressor's W8A8 recipes use 0.7-0.85.
        pairs: which sites to smooth (:data:`PAIRS`; default: all).

    Returns:
        ``{producer path: s}``: the ``[K]`` float32 factor applied at each site.

    Raises:
        ValueError: for unsupported models, quantized layers, a bad alpha, or stats
            missing a consumer.
    """
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"[mlx_w8a8.smooth] alpha must be in [0, 1], got {alpha!r}")
    applied = {}
    for g in groups(model, pairs):
        missing = [p for p in g.linears if p not in stats]
        if missing:
            raise ValueError(
                f"[mlx_w8a8.smooth] no calibration statistics for {missing}; run "
                f"mlx_w8a8.calibrate on this model (before smoothing it) first"
            )
        consumers = [_module(model, p) for p in g.linears]
        weights = [_float_weight(p, m) for p, m in zip(g.linears, consumers)]
        act = stats[g.linears[0]].absmax
        for p in g.linears[1:]:
            act = mx.maximum(act, stats[p].absmax)
        wmax = weights[0].astype(mx.float32).abs().max(axis=0)
        for w in weights[1:]:
            wmax = mx.maximum(wmax, w.astype(mx.float32).abs().max(axis=0))
        prev = _module(model, g.prev)
        if g.pair == "o":
            attn = _module(model, g.prev.rsplit(".", 1)[0])
            head_dim = act.shape[0] // attn.n_heads
            s_kv = _tied_factors(act, wmax, alpha, g.repeats, head_dim)  # v_proj rows
            s_in = mx.repeat(s_kv.reshape(-1, 1, head_dim), g.repeats, axis=1).reshape(-1)
        else:
            s_kv = s_in = factors(act, wmax, alpha)
        _divide_output(g.prev, prev, s_kv)
        for m, w in zip(consumers, weights):
            m.weight = (w.astype(mx.float32) * s_in[None, :]).astype(w.dtype)
        mx.eval(model.parameters())
        applied[g.prev] = s_kv
    return applied


def _divide_output(path: str, prev: nn.Module, s: mx.array) -> None:
    """Make ``prev``'s output ``out / s`` (per output channel)."""
    def div(a):
        return (a.astype(mx.float32) / s.reshape((-1,) + (1,) * (a.ndim - 1))).astype(a.dtype)

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
