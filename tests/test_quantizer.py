"""mlx_w8a8.quantizer: which layers quantize converts, skip patterns, the model's own
predicate, mixture-of-experts models."""

import dataclasses

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_w8a8 as w8
import tiny_lm
from tiny_checkpoints import Tiny, force_kernel, needs_mlx_lm



def test_quantize_converts_what_it_can(rng):
    model = Tiny()
    w8.quantize(model)
    assert isinstance(model.up, w8.Linear) and isinstance(model.down, w8.Linear)
    assert isinstance(model.odd, w8.Linear)
    assert isinstance(model.head, nn.Linear) and isinstance(model.embed, nn.Embedding)
    skip = Tiny()
    w8.quantize(skip, class_predicate=lambda path, m: path != "down")
    assert isinstance(skip.down, nn.Linear) and isinstance(skip.up, w8.Linear)


def test_matches_patterns():
    from mlx_w8a8.quantizer import matches

    assert matches("lm_head", "lm_head") and matches("language_model.lm_head", "lm_head")
    assert matches("model.layers.3.mlp.down_proj", "down_proj")
    assert not matches("model.layers.3.mlp.down_proj_x", "down_proj")  # whole names only
    assert not matches("model.layers.3.mlp.x_down_proj", "down_proj")  # ... at both ends
    assert matches("model.layers.0.self_attn.q_proj", "model.layers.0.*")
    assert not matches("model.layers.10.self_attn.q_proj", "model.layers.1.*")


def test_quantize_skip_keeps_layers_on_w8a16_or_float():
    model, _ = tiny_lm.model("llama")
    w8.quantize(model, skip={"lm_head": "w8a16", "layers.1.mlp.down_proj": "float", "down_proj": "w8a16"})
    assert type(model.lm_head) is nn.QuantizedLinear and model.lm_head.bits == 8
    assert type(model.model.layers[1].mlp.down_proj) is nn.Linear  # first matching pattern wins
    assert type(model.model.layers[0].mlp.down_proj) is nn.QuantizedLinear
    assert isinstance(model.model.layers[0].mlp.up_proj, w8.Linear)
    plain, _ = tiny_lm.model("llama")
    w8.quantize(plain, skip=["lm_head"])  # an iterable: W8A16
    assert type(plain.lm_head) is nn.QuantizedLinear
    with pytest.raises(ValueError, match=r"quantize\] skip maps layer patterns to one of"):
        w8.quantize(plain, skip={"lm_head": "int4"})
    with pytest.raises(ValueError, match=r"quantize\] skip must be a layer pattern.*got 5 \(int\)"):
        w8.quantize(plain, skip=5)


def test_quantize_honours_a_models_quant_predicate():
    # mlx-lm's hook: a layer the model says not to quantize stays as it is.
    class Picky(Tiny):
        @property
        def quant_predicate(self):
            return lambda path, module: path != "down"

    model = Picky()
    w8.quantize(model)
    assert type(model.down) is nn.Linear and isinstance(model.up, w8.Linear)



# --- mixture-of-experts models -----------------------------------------------------------


def _moe(kind: str):
    if kind == "mixtral":
        from mlx_lm.models import mixtral

        args = mixtral.ModelArgs(model_type="mixtral", vocab_size=64, hidden_size=64,
                                 intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
        return mixtral.Model(args), ["block_sparse_moe.gate"]
    from mlx_lm.models import qwen2_moe

    args = qwen2_moe.ModelArgs(model_type="qwen2_moe", hidden_size=64, num_hidden_layers=2,
                               intermediate_size=128, num_attention_heads=4, num_experts_per_tok=2,
                               num_experts=4, moe_intermediate_size=64,
                               shared_expert_intermediate_size=128, rms_norm_eps=1e-5,
                               vocab_size=64, num_key_value_heads=2)
    return qwen2_moe.Model(args), ["mlp.gate", "mlp.shared_expert_gate"]


@needs_mlx_lm
@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_quantize_moe_says_experts_were_left_and_keeps_routers(kind, capsys, tmp_path):
    from mlx_lm.utils import load_model

    model, router_names = _moe(kind)
    mx.eval(model.parameters())
    tokens = mx.array(np.random.default_rng(1).integers(0, 64, (1, 6)))
    with pytest.warns(UserWarning, match=r"\[mlx_w8a8.quantize\] 6 mixture-of-experts expert "
                      r"layers \(SwitchLinear, 4 experts each\) were left as they are: .*dense "
                      rf"linear layers only.*; {2 * len(router_names)} router layers"):
        w8.quantize(model, verbose=True)
    modules = dict(model.named_modules())
    routers = [f"model.layers.{i}.{name}" for i in range(2) for name in router_names]
    for path in routers:  # as they were: float nn.Linear, not W8A8
        assert type(modules[path]) is nn.Linear, path
    assert isinstance(modules["model.layers.0.self_attn.q_proj"], w8.Linear)
    if kind == "qwen2_moe":  # the dense shared expert converts
        assert isinstance(modules["model.layers.0.mlp.shared_expert.down_proj"], w8.Linear)
    err = capsys.readouterr().err
    assert "6 mixture-of-experts expert layers not converted" in err  # verbose's summary
    assert w8.summary(model).endswith("; 6 mixture-of-experts expert layers not converted")
    # The checkpoint loads in mlx-lm and here, routers and experts float in both.
    config = {k: v for k, v in dataclasses.asdict(model.args).items() if v is not None}
    w8.save(model, tmp_path / "ckpt", config)
    stock, _ = load_model(tmp_path / "ckpt")
    with pytest.warns(UserWarning, match="expert layers"):
        ours, _ = w8.load(tmp_path / "ckpt")
    for loaded in (stock, ours):
        kinds = dict(loaded.named_modules())
        assert all(type(kinds[p]) is nn.Linear for p in routers)
        assert type(kinds["model.layers.1.self_attn.o_proj"]) is (
            w8.Linear if loaded is ours else nn.QuantizedLinear)
    force_kernel(ours, "mlx_qmm")
    np.testing.assert_array_equal(np.array(stock(tokens)), np.array(ours(tokens)))


def test_quantize_with_activation_groups():
    # Float layers become group-wise (the default per_channel follows act_scales), and
    # 8-bit and 4-bit stored layers keep their weights; every converted layer scales its
    # activations per group.
    model = Tiny()
    w8.quantize(model, act_scales="group", group_size=32)
    for layer in (model.up, model.down, model.odd):
        assert layer.act_scales == "group" and layer.format == "grouped" and layer.group_size == 32
    for bits in (8, 4):
        stored = Tiny()
        nn.quantize(stored, group_size=64, bits=bits, class_predicate=lambda p, m: p == "up")
        w8.quantize(stored, act_scales="group")
        assert stored.up.act_scales == "group" and stored.up.bits == bits
    with pytest.raises(ValueError, match="per_channel=True"):
        w8.quantize(Tiny(), per_channel=True, act_scales="group")
    with pytest.raises(ValueError, match="act_scales must be one of"):
        w8.quantize(Tiny(), act_scales="tensor")
    # An 8-bit layer stored per channel (an mlx_w8a8 checkpoint read by mlx-lm) has no
    # groups to scale by: refused, and nothing converted.
    model = Tiny()
    per_channel_8bit = nn.QuantizedLinear(64, 128, group_size=64, bits=8)
    qw = w8.quantize_weight(model.up.weight, group_size=64)  # per channel, as saved
    per_channel_8bit.weight, per_channel_8bit.scales, per_channel_8bit.biases = qw.q, qw.scales, qw.biases
    model.up = per_channel_8bit
    with pytest.raises(ValueError, match="hold per-channel weights"):
        w8.quantize(model, act_scales="group")
    assert type(model.up) is nn.QuantizedLinear and type(model.down) is nn.Linear
