"""``mlx_w8a8.plans``: the one plan path of layers, sibling groups and ``w8a8_linear``:
kept from a key's second call, cleared by a registry invalidation, bounded by one limit."""

import mlx.core as mx
import numpy as np

import mlx_w8a8 as w8
from mlx_w8a8 import plans
from mlx_w8a8.kernels import registry


def test_a_plan_is_kept_from_its_keys_second_call():
    cache = plans.PlanCache()
    first, second = (lambda x: x), (lambda x: x)
    assert cache.keep(("a", 1), first, "d1") is first and not cache.plans
    assert cache.met(("a", 1)) and cache.decisions == {("a", 1): "d1"}
    assert cache.keep(("a", 1), second) is second and cache.plans == {("a", 1): second}
    assert not cache.met(("b", 2))


def test_past_the_limit_the_cache_starts_over(monkeypatch):
    # One bound per owner: keys, plans and decisions start over together.
    monkeypatch.setattr(plans, "LIMIT", 2)
    cache = plans.PlanCache()
    f = lambda x: x  # noqa: E731
    cache.keep(1, f, "d"), cache.keep(1, f, "d"), cache.keep(2, f, "d")
    assert list(cache.plans) == [1] and len(cache._met) == 2
    cache.keep(3, f, "d")  # the third key starts the cache over: 1 and 2 forgotten
    assert cache.plans == {} and cache.decisions == {3: "d"} and cache.met(3)
    assert not cache.met(1) and cache.keep(1, f) is f and cache.plans == {}


def test_an_invalidation_clears_every_cache_and_keeps_the_keys_met():
    cache = plans.PlanCache()
    f = lambda x: x  # noqa: E731
    cache.keep("k", f, "d"), cache.keep("k", f, "d")
    cache.hand("h", f, "d", registry.generation)
    registry.invalidate()
    assert cache.plans == {} and cache.decisions == {} and cache.handed == {}
    assert cache.keep("k", f) is f and cache.plans == {"k": f}  # met before: kept at once


def test_a_plan_decided_across_an_invalidation_is_not_kept(monkeypatch):
    # A measurement recorded (registry.invalidate) while a layer decides: the decision
    # it made may be stale, so its plan serves that call and is not kept; the next
    # call decides again.
    layer = w8.Linear(64, 32, group_size=32)
    x = mx.array(np.random.default_rng().standard_normal((3, 64)).astype(np.float32))
    real = registry.decide

    def decide_while_invalidated(*args):
        got = real(*args)
        registry.invalidate()
        return got

    mx.eval(layer(x))
    monkeypatch.setattr(registry, "decide", decide_while_invalidated)
    mx.eval(layer(x))  # second call at the shape: kept, were it not for the invalidation
    assert layer._plans == {}
    monkeypatch.setattr(registry, "decide", real)
    y = layer(x)
    assert list(layer._plans) == [((3, 64), mx.float32)]
    np.testing.assert_array_equal(np.array(y), np.array(layer(x)))


def test_w8a8_linear_keeps_no_plan_decided_across_an_invalidation(monkeypatch):
    rng = np.random.default_rng()
    w = w8.quantize_weight(mx.array(rng.standard_normal((16, 64)).astype(np.float32)))
    x = mx.array(rng.standard_normal((2, 64)).astype(np.float32))
    real = registry.choose

    def choose_while_invalidated(*args):
        got = real(*args)
        registry.invalidate()
        return got

    w8.w8a8_linear(x, w, kernel="exact")
    monkeypatch.setattr(registry, "choose", choose_while_invalidated)
    w8.w8a8_linear(x, w, kernel="exact")
    assert w._plans.plans == {}
    monkeypatch.setattr(registry, "choose", real)
    w8.w8a8_linear(x, w, kernel="exact")
    assert len(w._plans.plans) == 1


def test_quantized_matmul_plans_take_the_rows_as_one_matrix(monkeypatch):
    # mx.quantized_matmul batches every dimension before the last two: batched decode's
    # [B, 1, K] would run B one-row products (on CUDA each reads the whole weight), so a
    # layer hands it [B, K]; [1, T, K] and [T, K] go as they are (no reshape node)
    import mlx.nn as nn

    for bits, kernel in ((8, "mlx_qmm"), (4, "mlx_qmm4")):
        ql = nn.QuantizedLinear(128, 64, bias=True, group_size=64, bits=bits)
        layer = w8.Linear.from_linear(ql)
        layer.kernel = kernel
        seen = []
        real = mx.quantized_matmul

        def spy(x, *args, **kw):
            seen.append(tuple(x.shape))
            return real(x, *args, **kw)

        monkeypatch.setattr(mx, "quantized_matmul", spy)
        rng = np.random.default_rng(bits)
        for shape, handed in (((4, 1, 128), (4, 128)), ((2, 3, 128), (6, 128)),
                              ((1, 5, 128), (1, 5, 128)), ((5, 128), (5, 128))):
            x = mx.array(rng.standard_normal(shape).astype(np.float32))
            for _ in range(2):  # the first call's plan and the kept one
                seen.clear()
                y = layer(x)
                assert seen == [handed], (kernel, shape)
                assert y.shape == (*shape[:-1], 64)
                np.testing.assert_allclose(np.array(y), np.array(ql(x)), rtol=1e-5, atol=1e-5)
        monkeypatch.undo()
