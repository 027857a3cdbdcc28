"""One rank of the tensor-parallel tests (tests/test_distributed.py starts two).

Usage: ``python tests/tp_worker.py DIR`` with ``MLX_RANK`` and ``MLX_HOSTFILE`` set (the
ring backend) — or under ``mlx.launch -n 2 --backend ring``. Reads what the test wrote
in ``DIR`` (``layers.npz``, the float model in ``float/``, a W8A8 checkpoint in
``ckpt/``), runs every sharded computation and writes ``DIR/rank{r}.npz``. It asserts
nothing: the test compares the outputs against the single-process results.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx_w8a8 as w8  # noqa: E402
from mlx_w8a8 import distributed as tp  # noqa: E402

EXACT = "exact" if "exact" in w8.available_kernels() else "reference"


def force_exact(model: nn.Module) -> None:
    """Run every W8A8 layer on the exact W8A8 math (CPU's default is W8A16)."""
    for _, m in model.named_modules():
        if isinstance(m, w8.Linear):
            m.kernel = EXACT


def float_model(folder: Path):
    from mlx_lm.utils import load_model

    model, _ = load_model(folder)
    return model


def layers(data, group, out: dict) -> None:
    rank, size = group.rank(), group.size()
    for fmt, per_channel, gs in (("pc", True, 64), ("gr", False, 32)):
        lin = nn.Linear(1, 1)
        lin.weight, lin.bias = mx.array(data["w"]), mx.array(data["b"])
        layer = w8.Linear.from_linear(lin, group_size=gs, per_channel=per_channel)
        layer.kernel = EXACT
        x = mx.array(data["x"])
        a2s = tp.shard_linear(layer, "all-to-sharded", group=group)
        s2a = tp.shard_linear(layer, "sharded-to-all", group=group)
        k = x.shape[-1] // size
        out[f"layer_{fmt}_a2s"] = a2s(x)
        out[f"layer_{fmt}_s2a"] = s2a(x[:, rank * k : (rank + 1) * k])
        out[f"layer_{fmt}_classes"] = np.array([type(a2s).__name__, type(s2a).__name__])
        # Fused QKV-like weight: 2 segments, each split across ranks.
        seg = tp.shard_linear(layer, "all-to-sharded", segments=2, group=group)
        out[f"layer_{fmt}_a2s_seg2"] = seg(x)


def logits(model, tokens) -> mx.array:
    force_exact(model)
    return model(tokens)


def params(model) -> dict:
    return {k: v for k, v in tree_flatten(model.parameters())}


def main() -> int:
    folder = Path(sys.argv[1])
    backend = os.environ.get("MLX_W8A8_TP_BACKEND", "ring")
    group = mx.distributed.init(backend=backend, strict=True)
    rank = group.rank()
    data = np.load(folder / "layers.npz")
    tokens = mx.array(np.load(folder / "tokens.npy"))
    out: dict = {}
    layers(data, group, out)

    # Order 1: shard the float model (mlx-lm), then quantize (MLX's sharded classes).
    m1 = float_model(folder / "float")
    m1.shard(group)
    w8.quantize(m1)
    out["shard_then_quantize"] = logits(m1, tokens)
    out["classes"] = np.array(
        sorted({type(m).__name__ for _, m in m1.named_modules() if isinstance(m, w8.Linear)})
    )

    # Order 2: quantize, then shard (mlx-lm's shard() reached through mlx_w8a8.shard).
    m2 = float_model(folder / "float")
    w8.quantize(m2)
    tp.shard(m2, group)
    out["quantize_then_shard"] = logits(m2, tokens)
    # the sharded layers are new objects: mlx_w8a8.shard links their siblings again
    out["sibling_groups"] = np.array(sorted(
        "+".join(sorted(p.rsplit(".", 1)[-1] for p, m in m2.named_modules()
                        if isinstance(m, w8.Linear) and m.siblings is g))
        for g in {id(m.siblings): m.siblings for _, m in m2.named_modules()
                  if isinstance(m, w8.Linear) and m.siblings is not None}.values()))
    p1, p2 = params(m1), params(m2)
    out["param_names_differ"] = np.array(sorted(set(p1) ^ set(p2)))
    out["params_differ"] = np.array(
        sorted(k for k in set(p1) & set(p2) if not np.array_equal(np.array(p1[k]), np.array(p2[k])))
    )

    # 8-bit mlx-lm model sharded by mlx-lm (QuantizedAllToShardedLinear, ...), then W8A8.
    m3 = float_model(folder / "float")
    nn.quantize(m3, group_size=64, bits=8)
    m3.shard(group)
    w8.quantize(m3)
    out["q8_shard_then_quantize"] = logits(m3, tokens)

    # A checkpoint written by mlx_w8a8.save, loaded by mlx-lm's sharded_load.
    import mlx_lm.utils as lm_utils

    # The tokenizer is not under test (and needs transformers): a stand-in.
    lm_utils.load_tokenizer = lambda *args, **kwargs: None
    m4, _, config = lm_utils.sharded_load(str(folder / "ckpt"), return_config=True)
    tp.restore(m4, config)
    out["sharded_load"] = logits(m4, tokens)

    np.savez(folder / f"rank{rank}.npz", **{k: np.array(v) for k, v in out.items()})
    (folder / f"rank{rank}.done").write_text(json.dumps({"rank": rank, "size": group.size()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
