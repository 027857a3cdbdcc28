"""Mixture-of-experts layers: which layers of a model are experts and which are routers.

W8A8 converts dense linear layers only. The experts of a mixture-of-experts block
(mlx-lm's ``SwitchLinear`` / ``QuantizedSwitchLinear``, stacked ``[E, N, K]`` weights run
through ``gather_mm`` / ``gather_qmm``) are not converted by this version; the routers
(the small linear layers that score the experts, e.g. Mixtral's ``block_sparse_moe.gate``,
Qwen2-MoE's ``mlp.gate`` and ``mlp.shared_expert_gate``) stay as they are, as mlx-lm keeps
them on 8 bits where it quantizes the rest lower: their outputs pick the experts, and a
small error there changes which experts run, not just a value.

Classes are recognised by name so that this module needs no mlx-lm import.
"""

from __future__ import annotations

import mlx.nn as nn

# mlx-lm's expert layer classes (mlx_lm.models.switch_layers).
EXPERT_CLASSES = ("SwitchLinear", "QuantizedSwitchLinear")


def is_expert(module: nn.Module) -> bool:
    """Whether ``module`` is a stacked expert layer (``SwitchLinear`` or its quantized form)."""
    return type(module).__name__ in EXPERT_CLASSES


def expert_layers(model: nn.Module) -> list[str]:
    """Paths of the model's expert layers, sorted."""
    return sorted(path for path, m in model.named_modules() if is_expert(m))


def router_layers(model: nn.Module) -> list[str]:
    """Paths of the routers: every linear layer (float or quantized) held directly by a
    mixture-of-experts block, sorted. A block is a module with an expert layer among its
    children or its children's children (mlx-lm's ``SwitchGLU`` holds the experts one
    level down): Mixtral's ``block_sparse_moe.gate``, Qwen2-MoE's ``mlp.gate`` and
    ``mlp.shared_expert_gate``. A dense MLP beside the experts (Qwen2-MoE's
    ``mlp.shared_expert``) is a module, not a direct linear child, so its layers are not
    routers."""
    routers = []
    for path, block in model.named_modules():
        children = block.children()
        if not any(_holds_expert(child, 2) for child in children.values()):
            continue
        for name, child in children.items():
            if isinstance(child, (nn.Linear, nn.QuantizedLinear)):
                routers.append(f"{path}.{name}" if path else name)
    return sorted(routers)


def _holds_expert(value, depth: int) -> bool:
    """Whether ``value`` (a module, or a list/dict of them) is an expert layer or holds
    one within ``depth - 1`` levels below it."""
    if isinstance(value, nn.Module):
        if is_expert(value):
            return True
        return depth > 1 and any(_holds_expert(c, depth - 1) for c in value.children().values())
    if isinstance(value, (list, tuple)):
        return any(_holds_expert(v, depth) for v in value)
    if isinstance(value, dict):
        return any(_holds_expert(v, depth) for v in value.values())
    return False
