"""mlx_w8a8.evaluation: perplexity against closed forms and a float64 oracle; the exact
kernel per layer."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import tiny_lm
from mlx_w8a8.evaluation import perplexity



class Fixed(nn.Module):
    """Logits that do not depend on the model: uniform, or a sure guess of ``t + 1``."""

    def __init__(self, vocab, sure=None):
        super().__init__()
        self.vocab, self.sure = vocab, sure

    def __call__(self, t):
        if self.sure is None:
            return mx.zeros((*t.shape, self.vocab))
        hit = mx.arange(self.vocab) == ((t + 1) % self.vocab)[..., None]
        return self.sure * hit.astype(mx.float32)


def test_closed_forms(rng):
    data = [mx.array(rng.integers(0, 50, (3, 9))), mx.array(rng.integers(0, 50, (1, 9)))]
    ppl, count = perplexity(Fixed(50), data)
    assert count == 4 * 8  # each row predicts its tokens 1..T-1
    assert ppl == pytest.approx(50.0, rel=1e-5)  # uniform over 50 tokens
    counting = [mx.array(np.arange(i, i + 12)[None] % 50) for i in range(3)]  # t+1 follows t
    ppl, _ = perplexity(Fixed(50, sure=30.0), counting)
    assert ppl == pytest.approx(1.0, abs=1e-9 + 50 * np.exp(-30.0))
    with pytest.raises(ValueError, match=r"perplexity\] data is empty"):
        perplexity(Fixed(50), [])


@pytest.mark.parametrize("bad", [
    mx.zeros((3, 9)),  # float tokens
    mx.zeros((9,), mx.int32),  # one window without its batch axis
    mx.zeros((3, 1), mx.int32),  # a one-token window predicts nothing
    [[1, 2, 3]],  # a list, not an array
])
def test_refuses_batches_that_are_not_token_windows(bad):
    with pytest.raises(ValueError, match=r"perplexity\] each batch must be a \[B, T\] integer"):
        perplexity(Fixed(50), [bad])


def test_matches_a_float64_oracle_on_a_tiny_llama(rng):
    pytest.importorskip("mlx_lm", reason="mlx-lm is part of the test extra")
    model, _ = tiny_lm.model("llama", rng=rng)
    data = [mx.array(rng.integers(0, 256, (2, 11))), mx.array(rng.integers(0, 256, (1, 11)))]
    nll, count = 0.0, 0
    for b in data:
        logits = np.array(model(b[:, :-1])).astype(np.float64)
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        target = np.array(b[:, 1:])
        nll -= np.take_along_axis(logp, target[..., None], -1).sum()
        count += target.size
    ppl, n = perplexity(model, data)
    assert n == count
    assert ppl == pytest.approx(np.exp(nll / count), rel=1e-5)


def test_the_exact_kernel_means_each_layers_exact_math_4bit_included(rng):
    # A 4-bit layer (MLX's grouped4) refuses the 8-bit exact kernel; eval's default
    # (the exact math) must give it exact_w4a8, and the 8-bit layers exact.
    import mlx.nn as nn

    import mlx_w8a8 as w8
    from mlx_w8a8 import evaluation as ev
    from mlx_w8a8.nn import Linear

    four, eight = nn.Linear(64, 64), nn.Linear(64, 32)
    model = nn.Sequential(four, eight)
    nn.quantize(model, group_size=64, bits=4, class_predicate=lambda p, m: p == "layers.0")
    w8.quantize(model)
    assert ev.use_kernel(model, ev.EXACT) == 2
    layers = [m for _, m in model.named_modules() if isinstance(m, Linear)]
    assert sorted(m.kernel for m in layers) == ["exact", "exact_w4a8"]
    x = mx.array(rng.standard_normal((3, 64)).astype("float32"))
    assert model(x).shape == (3, 32)  # both layers run their forced kernels


def test_the_act_groups_variant_runs_the_activation_group_math(tmp_path):
    # From a float folder: mlx-lm's 8-bit weights, every converted layer with activation
    # groups on their exact kernel; its logits are those of exact_act_groups by hand.
    import tiny_lm
    from tiny_checkpoints import needs_mlx_lm  # noqa: F401  (mlx-lm is a test extra)

    import mlx_w8a8 as w8
    from mlx_w8a8 import evaluation as ev

    rng = np.random.default_rng(4)
    model, config = tiny_lm.model("llama", rng=rng)
    folder = tiny_lm.folder(tmp_path / "f", model, config)
    got = ev.load_variant(folder, "w8a8_act_groups", dtype="float32")
    layers = [m for _, m in got.named_modules() if isinstance(m, w8.Linear)]
    assert layers and {(m.act_scales, m.kernel) for m in layers} == {("group", "exact_act_groups")}
    plain = ev.load_variant(folder, "w8a8", dtype="float32")
    tokens = mx.array(rng.integers(0, 256, (1, 12)))
    assert not np.array_equal(np.array(got(tokens)), np.array(plain(tokens)))
