"""SmoothQuant folding: the float function is preserved, outliers move into the weights."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten

import mlx_w8a8 as w8
import oracle
import tiny_lm

pytest.importorskip("mlx_lm", reason="mlx-lm is part of the test extra")
from mlx_w8a8.calibrate import calibrate  # noqa: E402
from mlx_w8a8.smooth import factors, groups, smooth  # noqa: E402

# (family, query heads, KV heads): GQA with 2 query heads per KV head (the tied v -> o
# case), plain multi-head (no tie), and Qwen3's head_dim != hidden / heads.
CASES = [("llama", 4, 2), ("llama", 4, 4), ("mistral", 4, 1), ("qwen2", 4, 2), ("qwen3", 4, 2)]


def _tokens(rng, shape=(2, 24)):
    return mx.array(rng.integers(0, 256, shape))


@pytest.mark.parametrize("family,heads,kv", CASES)
def test_smoothing_preserves_the_float_function(rng, family, heads, kv):
    model, _ = tiny_lm.model(family, rng=rng, n_heads=heads, n_kv=kv)
    calib, t = _tokens(rng), _tokens(rng, (3, 17))
    ref = np.array(model(t)).astype(np.float64)
    alpha = float(rng.uniform(0.3, 0.9))
    applied = smooth(model, calibrate(model, [calib]), alpha)
    assert len(applied) == 4 * 2  # four sites per block, two blocks
    got = np.array(model(t)).astype(np.float64)
    # float32 rounding of the rescaled weights only: a wrong fold (a factor applied on
    # one side only, a v -> o head mapping off by one) is an O(1) change.
    assert np.abs(got - ref).max() <= 2e-5 * np.abs(ref).max()
    assert max(float(mx.abs(s - 1).max()) for s in applied.values()) > 0.1  # it did move


@pytest.mark.parametrize("family,heads,kv", [("llama", 4, 2), ("qwen3", 4, 2)])
def test_factors_follow_the_formula_and_divide_the_activations(rng, family, heads, kv):
    model, _ = tiny_lm.model(family, rng=rng, n_heads=heads, n_kv=kv)
    calib = [_tokens(rng)]
    before = calibrate(model, calib)
    weights = {p: np.abs(np.array(v)).astype(np.float64) for p, v in tree_flatten(model.parameters())}
    alpha = 0.6
    applied = smooth(model, before, alpha)
    after = calibrate(model, calib)
    for g in groups(model):
        a = np.array(before[g.linears[0]].absmax).astype(np.float64)
        w = np.max([weights[f"{p}.weight"].max(axis=0) for p in g.linears], axis=0)
        if g.repeats > 1:  # o_proj input (h, d): tied across the query heads of a KV head
            hd = a.size // heads
            a = a.reshape(kv, g.repeats, hd).max(axis=1).reshape(-1)
            w = w.reshape(kv, g.repeats, hd).max(axis=1).reshape(-1)
        want = a**alpha / w ** (1 - alpha)
        s = np.array(applied[g.prev]).astype(np.float64)
        np.testing.assert_allclose(s, want, rtol=1e-4, err_msg=g.prev)
        if g.repeats > 1:
            s = np.repeat(s.reshape(kv, 1, -1), g.repeats, axis=1).reshape(-1)
        got = np.array(after[g.linears[0]].absmax).astype(np.float64)
        np.testing.assert_allclose(got, np.array(before[g.linears[0]].absmax) / s, rtol=1e-4,
                                   atol=1e-6, err_msg=g.linears[0])


def test_factors_edge_channels():
    # A channel never activated (max 0) and one whose weight column is all zero keep
    # s = 1: dividing by 0 or by 0^(1 - alpha) would put inf / nan into the weights.
    a = mx.array([0.0, 4.0, 9.0, 1e-12])
    w = mx.array([1.0, 0.0, 1.0, 1.0])
    s = np.array(factors(a, w, 0.5))
    np.testing.assert_allclose(s, [1.0, 1.0, 3.0, 1e-5], rtol=1e-6)  # tiny ones clamp at 1e-5


def _inject_outliers(model, rng, factor=50.0, n=4):
    """Scale n channels of each norm by ``factor`` and compensate in the consumers: the
    same float function, with outlier activation channels like trained models grow."""
    for blk in model.model.layers:
        sites = ((blk.input_layernorm, (blk.self_attn.q_proj, blk.self_attn.k_proj, blk.self_attn.v_proj)),
                 (blk.post_attention_layernorm, (blk.mlp.gate_proj, blk.mlp.up_proj)))
        for norm, linears in sites:
            f = np.ones(norm.weight.shape[0], np.float32)
            f[rng.choice(f.size, n, replace=False)] = factor
            norm.weight = norm.weight * mx.array(f)
            for layer in linears:
                layer.weight = layer.weight / mx.array(f)[None, :]
    mx.eval(model.parameters())


def test_injected_outlier_channels_are_repaired_by_smoothing(rng):
    model, _ = tiny_lm.model("llama", rng=rng)
    _inject_outliers(model, rng)
    weights = tree_flatten(model.parameters())

    def copy():
        m, _ = tiny_lm.model("llama")
        m.update(tree_unflatten(weights))
        return m

    calib, t = _tokens(rng, (4, 32)), _tokens(rng, (2, 32))
    ref = np.array(model(t)).astype(np.float64)
    plain = oracle.sqnr_db(ref, np.array(w8.quantize(copy(), kernel="exact")(t)).astype(np.float64))
    smoothed = copy()
    smooth(smoothed, calibrate(smoothed, [calib]), 0.5)
    fixed = oracle.sqnr_db(ref, np.array(w8.quantize(smoothed, kernel="exact")(t)).astype(np.float64))
    print(f"W8A8 logits SQNR with 50x outlier channels: plain {plain:.1f} dB, smoothed {fixed:.1f} dB")
    # Measured: ~9 dB plain, ~33 dB smoothed. Per-token int8 spends its 127 levels on the
    # outliers; after smoothing they are spread over the weights' per-channel scales.
    assert fixed > plain + 15


def test_refuses_other_models_and_quantized_layers(rng):
    class NotAnLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

    with pytest.raises(ValueError, match=r"smooth\] supported models are .*got model_type None"):
        smooth(NotAnLM(), {})
    model, _ = tiny_lm.model("llama")
    model.model_type = "gemma"
    with pytest.raises(ValueError, match=r"got model_type 'gemma'"):
        smooth(model, {})
    model, _ = tiny_lm.model("llama", rng=rng)
    stats = calibrate(model, [_tokens(rng)])
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\], got 1.5"):
        smooth(model, stats, 1.5)
    with pytest.raises(ValueError, match=r"no calibration statistics"):
        smooth(model, {})
    w8.quantize(model)
    with pytest.raises(ValueError, match=r"is a Linear; smooth the float model before quantizing"):
        smooth(model, stats)


def _tiny_gemma3(rng):
    """A 2-block Gemma-3 text model (one sliding, one global layer) whose norms hold
    random ``w`` (they scale by ``1 + w``), and GQA with 2 query heads per KV head."""
    from mlx_lm.models import gemma3_text

    args = gemma3_text.ModelArgs(
        model_type="gemma3_text", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=256,
        sliding_window=8, sliding_window_pattern=2, query_pre_attn_scalar=32,
    )
    m = gemma3_text.Model(args)
    for block in m.model.layers:
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            norm = getattr(block, name)
            norm.weight = mx.array(rng.uniform(-0.5, 1.5, norm.weight.shape).astype(np.float32))
    mx.eval(m.parameters())
    return m


def test_gemma3_smoothing_folds_into_one_plus_w_norms(rng):
    model = _tiny_gemma3(rng)
    calib, t = _tokens(rng, (2, 16)), _tokens(rng, (2, 16))
    ref = np.array(model(t)).astype(np.float64)
    before = calibrate(model, [calib])
    sites = groups(model)
    # The MLP's input comes from pre_feedforward_layernorm (post_attention_layernorm
    # normalizes the attention output before the residual add).
    assert {g.prev for g in sites if g.pair == "mlp_in"} == {
        f"model.layers.{i}.pre_feedforward_layernorm" for i in range(2)}
    applied = smooth(model, before, 0.7)
    assert len(applied) == 4 * 2
    got = np.array(model(t)).astype(np.float64)
    assert np.abs(got - ref).max() <= 2e-5 * np.abs(ref).max()
    after = calibrate(model, [calib])
    for g in sites:
        if g.pair in ("attn_in", "mlp_in"):
            s = np.array(applied[g.prev]).astype(np.float64)
            np.testing.assert_allclose(np.array(after[g.linears[0]].absmax),
                                       np.array(before[g.linears[0]].absmax) / s, rtol=1e-4, atol=1e-6)


def test_per_site_alpha_leaves_unlisted_sites_alone(rng):
    model, _ = tiny_lm.model("llama", rng=rng)
    stats = calibrate(model, [_tokens(rng)])
    before = {p: np.array(v) for p, v in tree_flatten(model.parameters())}
    first, second = [g.prev for g in groups(model)][:2]
    applied = smooth(model, stats, {first: 0.8, second: None})
    assert list(applied) == [first]
    after = {p: np.array(v) for p, v in tree_flatten(model.parameters())}
    changed = {p for p in before if not np.array_equal(before[p], after[p])}
    assert changed == {f"{first}.weight"} | {f"{p}.weight" for p in groups(model)[0].linears}
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\], got 2"):
        smooth(model, stats, {first: 2})
