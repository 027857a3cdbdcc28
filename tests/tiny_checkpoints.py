"""Tiny models and checkpoint folders shared by the tests of quantize, save/load,
folder conversion and the ``mlx_w8a8.convert`` command line."""

import dataclasses
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest

import mlx_w8a8 as w8


class Tiny(nn.Module):
    """Three linear layers quantize converts (up, down, odd) and one it skips (head,
    K = 10), behind an embedding."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 64)
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64, bias=False)
        self.odd = nn.Linear(64, 10)  # K = 64 divides, N = 10: still converted
        self.head = nn.Linear(10, 7)  # K = 10 is no multiple of any group size: skipped

    def __call__(self, t):
        h = self.embed(t)
        return self.head(self.odd(self.down(nn.relu(self.up(h)))))


# Marked per test (not a module-level importorskip), so the tests that need no mlx-lm
# still run where mlx-lm is not installed.
try:
    from mlx_lm.models import llama
except ImportError:
    llama = None
needs_mlx_lm = pytest.mark.skipif(llama is None, reason="mlx-lm is part of the test extra")


def tiny_llama():
    """A two-layer bfloat16 mlx-lm Llama with random weights: ``(model, config dict)``."""
    args = llama.ModelArgs(
        model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256,
        tie_word_embeddings=False,
    )
    model = llama.Model(args)
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    return model, dataclasses.asdict(args)


def force_kernel(model, kernel):
    """Set ``kernel`` on every ``mlx_w8a8.Linear`` of ``model`` (``None``: the default
    dispatch)."""
    for _, m in model.named_modules():
        if isinstance(m, w8.Linear):
            m.kernel = kernel


def layer_kinds(model):
    """``{path: "W8A8" | "QuantizedLinear" | "Linear"}`` of the linear layers."""
    kinds = {}
    for path, m in model.named_modules():
        if isinstance(m, w8.Linear):
            kinds[path] = "W8A8"
        elif isinstance(m, (nn.QuantizedLinear, nn.Linear)):
            kinds[path] = type(m).__name__
    return kinds


def tree_bytes(folder: Path) -> dict:
    """``{relative path: bytes}`` of every file under ``folder``."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def quantized_folder(tmp_path, name, **kwargs):
    """A tiny Llama quantized by mlx-lm (``quantize_model`` with ``kwargs``), saved as
    mlx-lm saves it: ``(model, config, folder)``."""
    from mlx_lm.utils import quantize_model, save_config, save_model

    model, config = tiny_llama()
    model, config = quantize_model(model, config, **kwargs)
    folder = tmp_path / name
    save_model(folder, model)
    save_config(config, folder / "config.json")
    return model, config, folder
