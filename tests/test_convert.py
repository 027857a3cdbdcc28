"""Whole models: quantize, save, load — with stock mlx-lm reading our checkpoints."""

import dataclasses
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_w8a8 as w8
import oracle


class Tiny(nn.Module):
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


def test_quantize_converts_what_it_can(rng):
    model = Tiny()
    w8.quantize(model)
    assert isinstance(model.up, w8.Linear) and isinstance(model.down, w8.Linear)
    assert isinstance(model.odd, w8.Linear)
    assert isinstance(model.head, nn.Linear) and isinstance(model.embed, nn.Embedding)
    skip = Tiny()
    w8.quantize(skip, class_predicate=lambda path, m: path != "down")
    assert isinstance(skip.down, nn.Linear) and isinstance(skip.up, w8.Linear)


def test_save_and_load_with_model_instance(tmp_path, rng):
    model = Tiny()
    mx.eval(model.parameters())
    w8.quantize(model, group_size=32)
    t = mx.array(rng.integers(0, 50, (2, 5)))
    out = np.array(model(t))
    w8.save(model, tmp_path, {"note": "tiny"})
    cfg = json.loads((tmp_path / "config.json").read_text())
    # head (K = 10, not convertible) is a float linear layer: written per layer as false,
    # mlx-lm's convention, so both loaders leave it float.
    assert cfg["quantization"] == {"group_size": 32, "bits": 8, "mode": "affine", "head": False}
    assert set(cfg["mlx_w8a8"]["layers"]) == {"up", "down", "odd"} and cfg["note"] == "tiny"
    loaded, cfg2 = w8.load(tmp_path, Tiny())
    assert isinstance(loaded.up, w8.Linear) and loaded.up.quantized_weight.per_channel
    np.testing.assert_array_equal(np.array(loaded(t)), out)


def test_save_without_w8a8_layers_and_load_errors(tmp_path):
    with pytest.raises(ValueError, match=r"save.*no mlx_w8a8.Linear layers"):
        w8.save(Tiny(), tmp_path)
    with pytest.raises(ValueError, match=r"load.*no config.json"):
        w8.load(tmp_path / "missing", Tiny())
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"load.*not valid JSON"):
        w8.load(tmp_path, Tiny())


# --- a tiny randomly initialised mlx-lm Llama ------------------------------------------
# Marked per test (not a module-level importorskip), so the tests above still run
# where mlx-lm is not installed.
try:
    from mlx_lm.models import llama
except ImportError:
    llama = None
needs_mlx_lm = pytest.mark.skipif(llama is None, reason="mlx-lm is part of the test extra")


def _tiny_llama():
    args = llama.ModelArgs(
        model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256,
        tie_word_embeddings=False,
    )
    model = llama.Model(args)
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    return model, dataclasses.asdict(args)


def _use(model, kernel):
    for _, m in model.named_modules():
        if isinstance(m, w8.Linear):
            m.kernel = kernel


@needs_mlx_lm
def test_mlx_lm_llama_convert_run_save_load(tmp_path, rng):
    from mlx_lm.utils import load_model

    model, config = _tiny_llama()
    tokens = mx.array(rng.integers(0, 256, (2, 12)))
    ref = np.array(model(tokens).astype(mx.float32)).astype(np.float64)
    w8.quantize(model)
    n_layers = sum(isinstance(m, w8.Linear) for _, m in model.named_modules())
    assert n_layers == 2 * 7 + 1  # q, k, v, o, gate, up, down per block + lm_head
    reports = {}
    for kernel in ("exact", None):  # exact W8A8 math, and the default dispatch
        _use(model, kernel)
        logits = np.array(model(tokens).astype(mx.float32)).astype(np.float64)
        reports[kernel or "default"] = oracle.sqnr_db(ref, logits)
    print(f"tiny Llama logits SQNR vs bf16 model: {reports}")
    # A random tiny model has near-uniform logits; 25 dB still catches a broken layer
    # (a wrong scale or transposed weight drops it to ~0 dB).
    assert min(reports.values()) > 25

    # Stock mlx-lm runs the stored weights as W8A16 (mx.quantized_matmul): our layers
    # forced onto that candidate must give the same outputs bit for bit.
    _use(model, "mlx_qmm")
    want = np.array(model(tokens).astype(mx.float32))
    w8.save(model, tmp_path, config)
    stock, _ = load_model(Path(tmp_path))  # stock mlx-lm: an ordinary 8-bit model
    assert isinstance(stock.model.layers[0].mlp.gate_proj, nn.QuantizedLinear)
    np.testing.assert_array_equal(np.array(stock(tokens).astype(mx.float32)), want)
    ours, _ = w8.load(tmp_path)
    assert isinstance(ours.model.layers[0].mlp.gate_proj, w8.Linear)
    assert ours.model.layers[0].mlp.gate_proj.quantized_weight.per_channel
    _use(ours, "mlx_qmm")
    np.testing.assert_array_equal(np.array(ours(tokens).astype(mx.float32)), want)


@needs_mlx_lm
def test_load_converts_a_stock_8bit_checkpoint(tmp_path, rng):
    # An mlx-lm 8-bit checkpoint (group-wise affine, not per-channel) gets W8A8 layers
    # running the grouped math; its float layers stay float.
    from mlx_lm.utils import save_model, save_config

    model, config = _tiny_llama()
    nn.quantize(model, group_size=64, bits=8, class_predicate=lambda p, m: isinstance(m, nn.Linear) and p != "lm_head")
    save_model(tmp_path, model)
    save_config({**config, "quantization": {"group_size": 64, "bits": 8}}, tmp_path / "config.json")
    tokens = mx.array(rng.integers(0, 256, (1, 9)))
    want = np.array(model(tokens).astype(mx.float32)).astype(np.float64)
    ours, _ = w8.load(tmp_path)
    proj = ours.model.layers[1].self_attn.q_proj
    assert isinstance(proj, w8.Linear) and not proj.quantized_weight.per_channel
    assert isinstance(ours.lm_head, nn.Linear)
    _use(ours, "exact")
    got = np.array(ours(tokens).astype(mx.float32)).astype(np.float64)
    db = oracle.sqnr_db(want, got)
    print(f"stock 8-bit checkpoint, grouped W8A8 vs W8A16 logits: {db:.1f} dB")
    assert db > 25
