"""Models by preset, folder or config.json, built with mlx-lm's architecture."""

import json

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from mlx_w8a8 import models

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def params(model):
    return dict(tree_flatten(model.parameters()))


def test_resolve_preset_folder_file_and_dict(tmp_path):
    config, folder, label = models.resolve("qwen2.5-7b")
    assert (config["hidden_size"], config["intermediate_size"], config["vocab_size"]) == (3584, 18944, 152064)
    assert folder is None and label == "qwen2.5-7b"
    config["hidden_size"] = 1  # a copy: the preset is untouched
    assert models.PRESETS["qwen2.5-7b"]["hidden_size"] == 3584
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    config, folder, _ = models.resolve(tmp_path)  # a folder: its weights will be used
    assert config == TINY and folder == tmp_path
    config, folder, _ = models.resolve(tmp_path / "config.json")  # the architecture alone
    assert config == TINY and folder is None
    assert models.resolve(dict(TINY))[0] == TINY


def test_resolve_errors_name_what_is_valid(tmp_path):
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.models\].*llama-3-8b.*'nope'"):
        models.resolve("nope")
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ValueError, match="cannot read"):
        models.resolve(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="no 'model_type'"):
        models.resolve(tmp_path)
    with pytest.raises(ValueError, match="layers must be a positive int"):
        models.truncate(TINY, 0)


def test_random_build_is_seeded_bf16_and_truncated():
    pytest.importorskip("mlx_lm")
    a, config, _ = models.build(TINY, layers=2, seed=5)
    b, _, _ = models.build(TINY, layers=2, seed=5)
    c, _, _ = models.build(TINY, layers=2, seed=6)
    assert config["num_hidden_layers"] == 2 and len(a.layers) == 2
    pa, pb, pc = params(a), params(b), params(c)
    assert all(v.dtype == mx.bfloat16 for v in pa.values())
    assert all(mx.array_equal(pa[k], pb[k]) for k in pa)
    assert not mx.array_equal(pa["lm_head.weight"], pc["lm_head.weight"])


def test_folder_weights_are_loaded_not_redrawn(tmp_path):
    pytest.importorskip("mlx_lm")
    source, _, _ = models.build(TINY, seed=1, dtype=mx.float32)
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    mx.save_safetensors(str(tmp_path / "model.safetensors"), params(source))
    loaded, _, _ = models.build(tmp_path, seed=2, dtype=None)
    want, got = params(source), params(loaded)
    assert set(got) == set(want) and all(mx.array_equal(got[k], want[k]) for k in want)
    # its config.json alone: random weights of the same architecture
    fresh = params(models.build(tmp_path / "config.json", seed=2, dtype=None)[0])
    assert set(fresh) == set(want) and not mx.array_equal(fresh["lm_head.weight"], want["lm_head.weight"])
    # --layers on a checkpoint keeps the first blocks' weights
    short, config, _ = models.build(tmp_path, layers=1, seed=2, dtype=None)
    assert config["num_hidden_layers"] == 1 and len(short.layers) == 1
    assert mx.array_equal(short.layers[0].mlp.up_proj.weight, source.layers[0].mlp.up_proj.weight)


def test_clone_shares_the_weights():
    pytest.importorskip("mlx_lm")
    model, config, _ = models.build(TINY, seed=3)
    other = models.clone(model, config)
    want, got = params(model), params(other)
    assert all(mx.array_equal(got[k], want[k]) for k in want)
    assert other is not model and other.layers[0] is not model.layers[0]


def test_is_quantized():
    assert not models.is_quantized(TINY)
    assert models.is_quantized(dict(TINY, quantization={"group_size": 64, "bits": 4}))


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_bytes_counts_the_built_model(tied):
    """The lazy count equals the bytes of the model built and evaluated in that dtype
    (a tied lm_head is not counted twice); computed by hand for the untied model too."""
    pytest.importorskip("mlx_lm")
    config = dict(TINY, tie_word_embeddings=tied)
    for dtype in (mx.bfloat16, mx.float32):
        model, _, _ = models.build(config, dtype=dtype)
        mx.eval(model.parameters())
        built = sum(v.nbytes for v in params(model).values())
        assert models.parameter_bytes(config, dtype) == built
    if not tied:
        h, i, v, kv = 64, 128, 256, 2 * 16  # 2 KV heads of head_dim 16
        per_block = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h  # projections + 2 norms
        assert models.parameter_bytes(config, mx.float32) == 4 * (3 * per_block + 2 * v * h + h)
