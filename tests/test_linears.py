"""The distinct linear shapes of a model (what ``tune --model`` measures)."""

import mlx.core as mx
import mlx.nn as nn
import pytest

import mlx_w8a8
from mlx_w8a8 import models
from mlx_w8a8.tuning import linears, shapes

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
# Qwen2's q/k/v carry a bias, o does not: q (64x64, bias) and o (64x64) are two problems
QWEN2 = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


def keyed(found):
    return {(s.n, s.k, s.weight_format, s.group_size, s.has_bias): sorted(
        p.rsplit(".", 1)[-1] for p in s.paths) for s in found}


def test_llama_shapes_and_the_layers_that_share_them():
    pytest.importorskip("mlx_lm")
    model, _, _ = models.build(LLAMA)
    found, skipped = linears.model_shapes(model)
    assert skipped == []
    # Sibling groups add their summed shape (q+k+v: 64 + 32 + 32 = 128 = gate's N here;
    # gate+up: 256 = lm_head's), run as one launch where the kernel allows.
    qkv, gate_up = "q_proj+k_proj+v_proj", "gate_proj+up_proj"
    assert keyed(found) == {
        (64, 64, "per_channel", 64, False): ["o_proj", "o_proj", "q_proj", "q_proj"],
        (32, 64, "per_channel", 64, False): ["k_proj", "k_proj", "v_proj", "v_proj"],
        (128, 64, "per_channel", 64, False): ["gate_proj", "gate_proj", qkv, qkv,
                                              "up_proj", "up_proj"],
        (64, 128, "per_channel", 64, False): ["down_proj", "down_proj"],
        (256, 64, "per_channel", 64, False): [gate_up, gate_up, "lm_head"],
    }
    by_shape = {(s.n, s.k): s.paths for s in found}
    assert "model.layers.1.self_attn.q_proj+k_proj+v_proj" in by_shape[(128, 64)]
    firsts = [linears._path_order(s.paths[0]) for s in found]  # model order, by first layer
    assert firsts == sorted(firsts) and by_shape[(256, 64)][-1] == "lm_head"
    assert all(s.dtype == "bfloat16" for s in found)
    p = found[0].problem(16)
    assert (p.op, p.m, p.dtype, p.has_bias) == ("linear", 16, "bfloat16", False)
    assert len(linears.problems(found, [1, 2, 4])) == 15


def test_bias_is_part_of_the_key():
    pytest.importorskip("mlx_lm")
    model, _, _ = models.build(QWEN2)
    got = keyed(linears.model_shapes(model)[0])
    assert got[(64, 64, "per_channel", 64, True)] == ["q_proj"]
    assert got[(64, 64, "per_channel", 64, False)] == ["o_proj"]
    assert got[(32, 64, "per_channel", 64, True)] == ["k_proj", "v_proj"]


def test_converted_and_8bit_layers_keep_their_own_format():
    pytest.importorskip("mlx_lm")
    model, _, _ = models.build(LLAMA)
    mx.eval(model.parameters())
    before = keyed(linears.model_shapes(model)[0])
    w8 = models.clone(model, LLAMA)
    mlx_w8a8.quantize(w8)  # symmetric per-channel: the same problems as before
    assert keyed(linears.model_shapes(w8, weight_format="grouped", group_size=32)[0]) == before
    q8 = models.clone(model, LLAMA)
    nn.quantize(q8, group_size=32, bits=8)  # affine with offsets: grouped, group 32
    got = keyed(linears.model_shapes(q8)[0])
    assert set(got) == {(n, k, "grouped", 32, b) for n, k, _, _, b in before}
    q4 = models.clone(model, LLAMA)
    nn.quantize(q4, group_size=64, bits=4)  # MLX's 4-bit layers convert as stored: grouped4
    got = keyed(linears.model_shapes(q4)[0])
    assert set(got) == {(n, k, "grouped4", 64, b) for n, k, _, _, b in before}
    q3 = models.clone(model, LLAMA)
    nn.quantize(q3, group_size=64, bits=3)  # not convertible: reported, not tuned
    found, skipped = linears.model_shapes(q3)
    assert found == [] and len(skipped) == 15 and "3-bit affine" in skipped[0][1]


def test_tp_and_group_size_divisibility():
    pytest.importorskip("mlx_lm")
    model, _, _ = models.build(LLAMA)
    found, skipped = linears.model_shapes(model, group_size=32, tp=2)
    # + the sibling sums per rank: q+k+v 64x64 (= down), gate+up 128x64
    assert {(s.n, s.k) for s in found} == {(32, 64), (16, 64), (64, 32), (64, 64), (256, 64),
                                           (128, 64)}
    # group 64 does not divide o's K / tp = 32: o is skipped with the reason
    found, skipped = linears.model_shapes(model, group_size=64, tp=2)
    assert {p.rsplit(".", 1)[-1] for p, _ in skipped} == {"o_proj"}
    assert "not divisible by group size 64" in skipped[0][1]
    with pytest.raises(ValueError, match="not divisible by 3"):
        linears.model_shapes(model, tp=3)


def test_invalid_arguments_name_the_op():
    model = nn.Sequential(nn.Linear(64, 32))
    for kwargs, match in (({"dtype": "int8"}, "dtype"), ({"weight_format": "int4"}, "weight_format"),
                          ({"group_size": 48}, "group_size")):
        with pytest.raises(ValueError, match=rf"\[mlx_w8a8.tune_model\] {match}"):
            linears.model_shapes(model, **kwargs)
    # a plain MLX model works too (no mlx-lm needed); K 100 is not convertible
    found, skipped = linears.model_shapes(nn.Sequential(nn.Linear(64, 32), nn.Linear(100, 8)))
    assert [(s.n, s.k) for s in found] == [(32, 64)] and "K = 100" in skipped[0][1]


@pytest.mark.parametrize("name", sorted(models.PRESETS))
def test_presets_have_the_published_projection_shapes(name):
    pytest.importorskip("mlx_lm")
    # one block is enough: every block has the same shapes (built lazily, nothing allocated)
    model, config, _ = models.build(name, layers=1)
    got = {(s.n, s.k) for s in linears.model_shapes(model)[0]}
    # the sibling groups' summed shapes: q+k+v and gate+up
    h, heads = config["hidden_size"], config["num_attention_heads"]
    d = config.get("head_dim") or h // heads
    summed = {((heads + 2 * config.get("num_key_value_heads", heads)) * d, h),
              (2 * config["intermediate_size"], h)}
    if name == "llama-3.2-1b":  # q/o 2048x2048, k/v 512x2048, MLP; lm_head tied (none)
        assert summed == {(3072, 2048), (16384, 2048)}
        assert got == {(2048, 2048), (512, 2048), (8192, 2048), (2048, 8192)} | summed
        return
    if name == "phi-3-mini":  # q/k/v and gate/up stored fused: one layer each, no siblings
        assert summed == {(9216, 3072), (16384, 3072)}
        assert got == {(3072, 3072), (3072, 8192), (32064, 3072)} | summed
        return
    family = shapes.FAMILIES[name]
    assert got == (set(family["attn"]) | set(family["mlp"]) | summed
                   | {(config["vocab_size"], config["hidden_size"])})
