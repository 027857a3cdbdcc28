"""mlx_w8a8.Linear inside mlx-lm's generation loop: decisions made once, the decode
shape reused, and the same tokens as the same layers run step by step."""

import mlx.core as mx
import pytest

import mlx_w8a8 as w8
from mlx_w8a8.kernels import registry

llama = pytest.importorskip("mlx_lm.models.llama", reason="mlx-lm is part of the test extra")
generate = pytest.importorskip("mlx_lm.generate", reason="mlx-lm is part of the test extra")
make_prompt_cache = pytest.importorskip("mlx_lm.models.cache").make_prompt_cache


def _model(kernel):
    args = llama.ModelArgs(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=97,
        tie_word_embeddings=False,
    )
    mx.random.seed(3)
    model = llama.Model(args)
    model.set_dtype(mx.bfloat16)
    w8.quantize(model, group_size=32, kernel=kernel)
    return model


@pytest.mark.parametrize("kernel", ["exact", "mlx_qmm"])
def test_generate_step_runs_and_keeps_its_plans_from_the_second_call(kernel, monkeypatch):
    model = _model(kernel)
    made = []
    real = registry.decide
    monkeypatch.setattr(registry, "decide", lambda *a: made.append(a[0].m) or real(*a))
    prompt = mx.array([5, 17, 3, 42, 8, 1])
    steps = list(generate.generate_step(prompt, model, max_tokens=8))
    tokens = [int(t) for t, _ in steps]
    assert len(tokens) == 8
    layers = sum(isinstance(m, w8.Linear) for _, m in model.named_modules())
    # generate_step prefills all but the last prompt token (M = 5), then decodes one
    # token at a time (M = 1): one decision per layer for the prompt (a shape met once:
    # its plan is not kept), two for decoding (the first step's plan is not kept, the
    # second's is), and the other decode steps reuse the kept plans.
    assert sorted(set(made)) == [1, 5] and len(made) == 3 * layers
    assert made.count(1) == 2 * layers

    # The same tokens by hand, greedy, with the layers' plans already warm.
    cache = make_prompt_cache(model)
    logits = model(prompt[None], cache=cache)[:, -1]
    by_hand = []
    for _ in range(8):
        nxt = mx.argmax(logits, axis=-1)
        by_hand.append(int(nxt.item()))
        logits = model(nxt[None], cache=cache)[:, -1]
    assert by_hand == tokens
