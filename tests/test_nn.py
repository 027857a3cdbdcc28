"""mlx_w8a8.Linear: parameters, conversion, serialization, numerics."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import mlx_w8a8 as w8
import oracle


def test_parameters_are_those_of_an_8bit_quantized_linear():
    layer = w8.Linear(128, 48)
    stock = nn.QuantizedLinear(128, 48, group_size=64, bits=8)
    ours = {k: (v.shape, v.dtype) for k, v in tree_flatten(layer.parameters())}
    theirs = {k: (v.shape, v.dtype) for k, v in tree_flatten(stock.parameters())}
    assert ours == theirs
    assert layer.trainable_parameters() == {}  # frozen, like nn.QuantizedLinear
    assert "bias" not in w8.Linear(128, 48, bias=False)


def test_safetensors_round_trip(tmp_path, rng):
    layer = w8.Linear(128, 48, group_size=32)
    layer.bias = mx.array(rng.standard_normal(48).astype(np.float32))
    path = str(tmp_path / "layer.safetensors")
    mx.save_safetensors(path, dict(tree_flatten(layer.parameters())))
    other = w8.Linear(128, 48, group_size=32)
    other.load_weights(path)
    x = mx.array(rng.standard_normal((3, 128)).astype(np.float32))
    for kernel in (None, "exact"):
        layer.kernel = other.kernel = kernel
        np.testing.assert_array_equal(np.array(layer(x)), np.array(other(x)))
    # After load_weights the layer re-derives its format from the new arrays.
    assert other.quantized_weight.q is other.weight and other.quantized_weight.per_channel


def test_from_linear_per_channel_and_grouped(rng):
    base = nn.Linear(256, 64)
    x = mx.array(rng.standard_normal((2, 7, 256)).astype(np.float32))
    for per_channel in (True, False):
        layer = w8.Linear.from_linear(base, group_size=128, per_channel=per_channel)
        layer.kernel = "exact"
        assert layer.quantized_weight.per_channel == per_channel
        np.testing.assert_array_equal(np.array(layer.bias), np.array(base.bias))
        y = layer(x)
        assert y.shape == (2, 7, 64)
        want, bound = oracle.linear(np.array(x).reshape(-1, 256), layer.quantized_weight,
                                    np.array(base.bias))
        oracle.assert_close(y.reshape(-1, 64), want, bound, "float32")
        dense = np.array(x).reshape(-1, 256).astype(np.float64) @ np.array(base.weight).T + np.array(base.bias)
        db = oracle.sqnr_db(dense, np.array(y).reshape(-1, 64))
        print(f"Linear.from_linear per_channel={per_channel}: SQNR {db:.1f} dB vs float64")
        assert db > 30


def test_from_quantized_linear_keeps_weights_exactly(rng):
    stock = nn.QuantizedLinear(128, 32, bias=True, group_size=32, bits=8)
    stock.bias = mx.array(rng.standard_normal(32).astype(np.float32))
    layer = w8.Linear.from_linear(stock)
    for name in ("weight", "scales", "biases", "bias"):
        np.testing.assert_array_equal(np.array(layer[name]), np.array(stock[name]))
    assert layer.group_size == 32 and not layer.quantized_weight.per_channel
    x = mx.array(rng.standard_normal((1, 128)).astype(np.float32))
    # The default (untuned) path at M = 1 is the stock W8A16 product, bit for bit.
    np.testing.assert_array_equal(np.array(layer(x)), np.array(stock(x)))


def test_bad_construction():
    with pytest.raises(ValueError, match=r"Linear.*group_size 64 does not divide K = 96"):
        w8.Linear(96, 8)
    with pytest.raises(ValueError, match=r"Linear.*input_dims must be a positive int, got 0"):
        w8.Linear(0, 8)
    with pytest.raises(ValueError, match=r"from_linear.*only 8-bit and 4-bit affine.*bits=2"):
        w8.Linear.from_linear(nn.QuantizedLinear(64, 8, group_size=64, bits=2))
    with pytest.raises(ValueError, match=r"Linear.*bits must be one of \(4, 8\), got 2"):
        w8.Linear(64, 8, bits=2)
    with pytest.raises(ValueError, match=r"from_linear.*nn.Linear or an 8-bit.*Embedding"):
        w8.Linear.from_linear(nn.Embedding(10, 64))


def test_forced_kernel_is_used(rng):
    layer = w8.Linear(64, 16, bias=False)
    x = mx.array(rng.standard_normal((2, 64)).astype(np.float32))
    layer.kernel = "exact"
    want, bound = oracle.linear(np.array(x), layer.quantized_weight, None)
    oracle.assert_close(layer(x), want, bound, "float32")
    # An unknown name is refused where it is set, not at the next call; the layer keeps
    # the kernel it had.
    with pytest.raises(ValueError, match="unknown kernel 'does_not_exist'"):
        layer.kernel = "does_not_exist"
    assert layer.kernel == "exact"


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("per_channel", [True, False])
def test_one_group_per_row_is_not_garbage(rng, group_size, per_channel):
    # K = group size at M > 1: MLX 0.32.4's CUDA quantized_matmul returns zeros, stale
    # or non-finite values there (reference.qmm_supports), so whatever the layer runs by
    # default must give the product. The oracle is the float64 product of the stored
    # weight; W8A8 or W8A16 rounding is far inside 5% of the largest output (the
    # defect's errors were 100% or infinite). On a CPU this passes with mlx_qmm too; on
    # CUDA it fails if the guard lets mlx_qmm run here.
    layer = w8.Linear(group_size, 48, group_size=group_size, per_channel=per_channel)
    w = oracle.codes(layer.quantized_weight).astype(np.float64)
    qw = layer.quantized_weight
    dq = w * np.array(qw.scales.astype(mx.float32), np.float64).repeat(group_size, 1) + np.array(
        qw.biases.astype(mx.float32), np.float64).repeat(group_size, 1)
    for m, dtype in ((4, mx.float32), (32, mx.bfloat16), (256, mx.float16)):
        x = mx.array(rng.standard_normal((m, group_size)).astype(np.float32)).astype(dtype)
        want = oracle.to_numpy(x).astype(np.float64) @ dq.T + oracle.to_numpy(layer.bias)
        got = oracle.to_numpy(layer(x)).astype(np.float64)
        assert np.isfinite(got).all()
        assert np.max(np.abs(got - want)) <= 0.05 * np.max(np.abs(want)), (m, dtype)


def test_works_under_mx_compile(rng):
    # mlx-lm users compile their step functions; the layer's per-channel detection (a
    # host read) must not run on traced values. It runs on the parameters, which are
    # concrete, also right after they were replaced.
    # The comparison allows what compiling may change on a GPU (the epilogue's FMA
    # contraction, a float kernel's summation order: oracle.assert_same_but_rounding),
    # nothing more.
    layer = w8.Linear(128, 64)
    x = mx.array(rng.standard_normal((4, 128)).astype(np.float32))
    for kernel in (None, "exact"):
        layer.kernel = kernel
        got, want = mx.compile(lambda v: layer(v))(x), layer(x)
        try:
            oracle.assert_same_but_rounding(got, want, x, layer.quantized_weight, layer.bias)
        except AssertionError as error:
            raise AssertionError(f"kernel={kernel!r} ({layer.decision(4, x.dtype)}): {error}") from None
    fresh = w8.Linear(128, 64)
    fresh.update(layer.parameters())
    fresh.kernel = "exact"
    oracle.assert_same_but_rounding(mx.compile(lambda v: fresh(v))(x), layer(x), x,
                                    layer.quantized_weight, layer.bias)


# --- the hot path: decide once, run many -------------------------------------------------

import mlx_w8a8.nn as w8nn  # noqa: E402
import mlx_w8a8.plans as w8plans  # noqa: E402
from mlx_w8a8 import tuning  # noqa: E402
from mlx_w8a8.kernels import registry  # noqa: E402
from mlx_w8a8.kernels.registry import Candidate  # noqa: E402
from mlx_w8a8.tuning import prior, table  # noqa: E402

QMM = registry.get("linear", "mlx_qmm")


@pytest.fixture
def tables(only_written_tables, monkeypatch):
    """No tables but the ones a test writes; no prior; spies removed after."""
    monkeypatch.setattr(prior, "RULES", {})
    yield only_written_tables
    for name in ("spy", "staged"):
        registry.unregister("linear", name)


def _spy(calls, name="spy"):
    def run(x, w, b):
        calls.append(x.shape)
        return QMM.run(x, w, b)
    registry.register(Candidate(name=name, backend="any", op="linear", run=run, digest="d-" + name))


def _entry(layer, choice, m_bucket=2):
    return {"op": "linear", "m_bucket": m_bucket, "n": layer.output_dims, "k": layer.input_dims,
            "dtype": "float32", "weight_format": layer.format, "group_size": layer.group_size,
            "choice": choice, "has_bias": "bias" in layer,
            "candidates": {choice: {"digest": "d-" + choice}}}


def test_a_plan_is_kept_from_the_second_call_at_a_shape(tables, monkeypatch):
    # The first call at a shape plans for itself alone (a shape met once, a server's
    # prompt length, leaves nothing for the collector); the second plans and keeps it;
    # later calls decide nothing.
    layer = w8.Linear(64, 32, group_size=32)
    x = mx.ones((2, 64))
    made = []
    real = registry.decide
    monkeypatch.setattr(registry, "decide", lambda *a: made.append(a) or real(*a))
    mx.eval(layer(x))
    assert len(made) == 1 and layer._plans == {}
    for _ in range(4):
        mx.eval(layer(x))
    assert len(made) == 2 and list(layer._plans) == [((2, 64), mx.float32)]
    mx.eval(layer(mx.ones((3, 64))), layer(mx.ones((2, 64), dtype=mx.bfloat16)))
    assert len(made) == 4  # a new shape and a new dtype are new decisions
    assert len(layer._plans) == 1 and layer.decision(3, mx.float32)[0] in repr(layer)


def test_shapes_met_once_are_remembered_up_to_a_bound(tables, monkeypatch):
    # A server meets ever-new prompt lengths: the keys of shapes met once (and their
    # decisions) start over at plans.LIMIT instead of growing; a shape met again after
    # that keeps its plan one call later.
    from mlx_w8a8 import plans

    monkeypatch.setattr(plans, "LIMIT", 3)
    layer = w8.Linear(64, 32, group_size=32)
    for m in range(1, 8):
        mx.eval(layer(mx.ones((m, 64))))
        assert len(layer._cache._met) <= 3 and len(layer._decisions) <= 3
    assert layer._plans == {}
    mx.eval(layer(mx.ones((7, 64))))  # met just before: kept
    assert list(layer._plans) == [((7, 64), mx.float32)]


@pytest.mark.parametrize("event", ["set_tuning_table", "reload", "online_record", "forced_kernel"])
def test_cached_decision_is_invalidated(tables, event):
    calls = []
    _spy(calls)
    layer = w8.Linear(64, 32, group_size=32)
    x = mx.ones((2, 64))
    path = str(tables / "t.json")
    if event == "reload":
        w8.set_tuning_table(path)
    mx.eval(layer(x))
    assert calls == [] and layer.decision(2, mx.float32)[0] == "mlx_qmm"
    if event == "forced_kernel":
        layer.kernel = "spy"
    elif event == "online_record":
        t = tuning.get_tuner()
        claim = t.claim(layer.problem(2, mx.float32))
        t.record(claim, _entry(layer, "spy"))
    else:
        table.write_entries(path, table.device_key(), [_entry(layer, "spy")])
        if event == "set_tuning_table":
            w8.set_tuning_table(path)
        else:
            tuning.reload()
    mx.eval(layer(x))
    assert calls == [(2, 64)]
    if event == "forced_kernel":
        layer.kernel = None
        mx.eval(layer(x))
        assert calls == [(2, 64)]


def test_compile_with_inputs_state_and_as_a_closure(tables, rng):
    # mlx-lm compiles step functions with the model's state as an input; the layer must
    # not read traced weights back to the host (format is a static attribute).
    # The second layer (K = 64, one group per row) is where MLX 0.32.4's CUDA
    # quantized_matmul is wrong (reference.qmm_supports). Each layer's compiled output is
    # compared with the eager layer on the compiled input it got: a last-bit difference
    # in the first layer (what compiling may change, oracle.assert_same_but_rounding)
    # can move one of the second layer's activation codes, so the model's eager output
    # is not the reference for the compiled one.
    model = nn.Sequential(w8.Linear(128, 64), w8.Linear(64, 32, bias=False))
    x = mx.array(rng.standard_normal((4, 128)).astype(np.float32))

    def check(compiled, layers):
        h, y = compiled(x)
        oracle.assert_same_but_rounding(h, layers[0](x), x, layers[0].quantized_weight,
                                        layers[0].bias)
        oracle.assert_same_but_rounding(y, layers[1](h), h, layers[1].quantized_weight)

    def both(m):
        return lambda v: (lambda h: (h, m.layers[1](h)))(m.layers[0](v))

    for kernel in (None, "exact"):
        for layer in model.layers:
            layer.kernel = kernel
        check(mx.compile(both(model), inputs=model.state), model.layers)
        check(mx.compile(both(model)), model.layers)
    # Replacing the parameters (as a compiled training step or update() would) is seen.
    fresh = nn.Sequential(w8.Linear(128, 64), w8.Linear(64, 32, bias=False))
    fresh.update(model.parameters())
    for layer in fresh.layers:
        layer.kernel = "exact"
    check(mx.compile(both(fresh), inputs=fresh.state), model.layers)


def test_format_is_static_and_checked_once_when_weights_are_replaced(rng):
    layer = w8.Linear(128, 16, group_size=32)
    assert layer.format == "per_channel"
    grouped = w8.quantize_weight(mx.array(rng.standard_normal((16, 128)).astype(np.float32)),
                                 group_size=32, per_channel=False)
    layer.update({"weight": grouped.q, "scales": grouped.scales, "biases": grouped.biases})
    layer.kernel = "exact"
    x = mx.array(rng.standard_normal((3, 128)).astype(np.float32))
    y = layer(x)
    # The per-channel claim no longer holds: the layer runs the grouped math (correct).
    assert layer.format == "grouped"
    want, bound = oracle.linear(np.array(x), grouped, np.array(layer.bias))
    oracle.assert_close(y, want, bound, "float32")


def test_layers_fed_the_same_input_quantize_it_once(tables):
    quantized = []

    def quantize(x):
        quantized.append(x.shape)
        return x  # the "activations" of this fake are x itself

    def apply(acts, w, b, dtype):
        return QMM.run(acts, w, b).astype(dtype)

    stages = lambda problem: (("fake", problem.k), quantize, apply)  # noqa: E731
    registry.register(Candidate(name="staged", backend="any", op="linear",
                                run=lambda x, w, b: apply(quantize(x), w, b, x.dtype),
                                stages=stages))
    q, k, v = (w8.Linear(64, n, group_size=32) for n in (32, 16, 16))
    for layer in (q, k, v):
        layer.kernel = "staged"
    w8nn.clear_shared_activations()
    x = mx.ones((2, 3, 64))
    outs = [layer(x) for layer in (q, k, v)]
    assert len(quantized) == 1  # q, k and v shared one quantization of x
    for layer, out in zip((q, k, v), outs):
        layer.kernel = "mlx_qmm"
        np.testing.assert_allclose(np.array(out), np.array(layer(x)), rtol=1e-6)
        layer.kernel = "staged"
    x2 = mx.ones((2, 3, 64))  # equal values, another array: quantized again
    mx.eval(q(x2), k(x2))
    assert len(quantized) == 2
    w8nn.share_activations(False)  # off (the model benchmark measures the saving)
    try:
        mx.eval(q(x2), k(x2))
        assert len(quantized) == 4
    finally:
        w8nn.share_activations(True)


def test_set_dtype_after_the_first_call_keeps_the_output_dtype(rng):
    # The mlx_qmm plan decides at bind time whether a cast back to x's dtype is needed
    # (none when x, scales and bias share a dtype); replacing the parameters
    # (set_dtype) must make it bind again, or a float16 layer fed bfloat16 would return
    # float32 (quantized_matmul promotes).
    layer = w8.Linear(64, 16, group_size=32)
    layer.kernel = "mlx_qmm"
    layer.set_dtype(mx.bfloat16)
    x = mx.array(rng.standard_normal((2, 64)).astype(np.float32)).astype(mx.bfloat16)
    assert layer(x).dtype == mx.bfloat16  # bound without a cast
    layer.set_dtype(mx.float16)
    y = layer(x)
    assert layer["scales"].dtype == mx.float16 and y.dtype == mx.bfloat16
    assert layer(x.astype(mx.float32)).dtype == mx.float32  # float32 x: promoted, kept
    layer.kernel = "exact"
    np.testing.assert_allclose(np.array(y.astype(mx.float32)),
                               np.array(layer(x).astype(mx.float32)), atol=0.1, rtol=0.05)


@pytest.mark.parametrize("kernel", [None, "exact", "mlx_qmm"])
def test_arrays_replaced_without_setitem_are_used(kernel):
    # mx.compile(..., inputs=model.state) swaps a layer's arrays without __setitem__: the
    # next call must compute with the new bias and weight, whichever kernel runs
    layer = w8.Linear(64, 32, group_size=32)
    layer.kernel = kernel
    x = mx.random.normal((2, 3, 64))
    y0 = layer(x)
    dict.__setitem__(layer, "bias", mx.ones((32,)))
    np.testing.assert_allclose(np.array(layer(x)), np.array(y0) + 1, rtol=1e-5, atol=1e-5)
    other = w8.Linear(64, 32, group_size=32)
    for name in ("weight", "scales", "biases"):
        dict.__setitem__(layer, name, other[name])
    ref = w8.Linear.from_weight(other.quantized_weight, mx.ones((32,)))
    ref.kernel = kernel
    want = np.array(ref(x))
    np.testing.assert_allclose(np.array(layer(x)), want, rtol=1e-5, atol=1e-5)


def test_a_fused_plan_traces_nothing_after_the_model_benchs_warm_up():
    """A fused plan's compiled calls trace on their first call per input shape: the one
    returning the activations on the plan's first call, the output-only one when the
    layer stops offering (plans.Stages). Both must come within modelbench.WARMUP calls, or
    the bench's steady-state rounds time a trace (with 4 untaken offers the fifth call
    traced: round 3 of every 6-round model bench on an NVIDIA H200 ran 0.4-1.8 ms slow)."""
    import mlx_w8a8.nn as w8nn
    from mlx_w8a8 import modelbench

    def stages(log):
        # the Python bodies run when mx.compile traces them (and where a layer takes
        # another's activations: apply alone, uncompiled, as the taker below does)
        def quantize(x):
            log.append("quantize")
            return x * 2, mx.ones((1,)), None

        def apply(acts):
            log.append("apply")
            return acts[0] + 1
        return quantize, apply

    w8nn.clear_shared_activations()
    traced = []
    alone = w8plans.Stages(("fake-alone",), *stages(traced), True)  # an o_proj
    first = w8plans.Stages(("fake-pair",), *stages(traced), True)  # q of q/k/v
    taker = w8plans.Stages(("fake-pair",), *stages([]), True)  # k: takes q's
    after = []
    for i in range(modelbench.WARMUP + 6):
        x, y = mx.array([float(i), 1.0, 2.0]), mx.array([float(i), 3.0, 4.0])
        mx.eval(alone(x), first(y), taker(y))
        after.append(len(traced))
    assert after[0] > 0  # traced on the first call
    assert after[modelbench.WARMUP - 1] > after[0]  # the output-only call, traced later
    assert after[modelbench.WARMUP - 1:] == [after[-1]] * (len(after) - modelbench.WARMUP + 1)


def test_a_fused_plans_first_call_runs_its_stages_directly():
    """The first call of a fused plan (plans.Stages) runs quantize and apply themselves on
    the caller's array: a shape met once (a server's prompt length) traces no compiled
    call. Later calls go through the compiled calls, whose traces see stand-ins."""
    import mlx_w8a8.nn as w8nn

    seen = []

    def quantize(x):
        seen.append(x)
        return x * 2, mx.ones((1,)), None

    def apply(acts):
        return acts[0] + 1

    for offers_taken in (False, True):
        w8nn.clear_shared_activations()
        seen.clear()
        layer = w8plans.Stages(("fake-direct",), quantize, apply, True)
        taker = w8plans.Stages(("fake-direct",), quantize, apply, True)
        xs = [mx.array([float(i), 2.0]) for i in range(3)]
        for i, x in enumerate(xs):
            assert layer(x).tolist() == [2 * i + 1, 5.0]
            if offers_taken:
                assert taker(x).tolist() == [2 * i + 1, 5.0]
        assert seen[0] is xs[0]  # the first call: quantize got x itself
        assert not any(s is x for s in seen[1:] for x in xs[1:])  # later: traced stand-ins


def test_fused_stages_stop_offering_activations_nobody_takes():
    """plans.Stages with fused (one compiled call): a layer offers its activations to the
    memo until _UNTAKEN_OFFERS offers in a row were taken by no other layer, then runs
    the call that returns the output alone (no memo entry for its x); a layer whose
    offers another layer takes keeps offering; outputs are right on every path; a
    dropped offer leaves nothing of x held by the layer."""
    import gc
    import weakref

    import mlx_w8a8.nn as w8nn

    def quantize(x):
        return x * 2, mx.ones((1,)), None

    def apply(acts):
        return acts[0] + 1

    def offered(x):
        return any(slot[0] is x for slot in w8plans._shared.slots)

    w8nn.clear_shared_activations()
    alone = w8plans.Stages(("fake",), quantize, apply, True)
    limit = w8plans._UNTAKEN_OFFERS
    for i in range(limit + 4):
        x = mx.array([float(i), 1.0])
        assert alone(x).tolist() == [2 * i + 1, 3.0]
        assert offered(x) == (i < limit), i
    w8nn.clear_shared_activations()
    first = w8plans.Stages(("fake",), quantize, apply, True)
    taker = w8plans.Stages(("fake",), quantize, apply, True)
    for i in range(limit + 4):
        x = mx.array([float(i), 1.0])
        assert first(x).tolist() == [2 * i + 1, 3.0]
        assert offered(x), i
        assert taker(x).tolist() == [2 * i + 1, 3.0]
    assert taker.last is None  # it took every time, never offered
    # Once the memo drops an offer, the layer holds neither x nor its activations (every
    # layer of a model keeps its plans.Stages between forwards).
    w8nn.clear_shared_activations()
    x = mx.array([1.0, 2.0])
    seen = weakref.ref(x)
    first(x)
    w8nn.clear_shared_activations()
    del x
    gc.collect()
    assert seen() is None, "the layer keeps its last input alive"


def test_linear_past_the_per_channel_k_bound_runs_qmm_and_refuses_a_forced_w8a8_kernel():
    # K = 133152 > 132104: a per-channel int32 sum over K can overflow. On the CPU the
    # prior picks the exact kernel for per-channel weights; it must not be a candidate
    # here (it gave -133136 for 133152), and forcing it must name the bound.
    k = 133152
    layer = w8.Linear.from_weight(w8.quantize_weight(mx.ones((2, k)), group_size=32))
    x = mx.ones((1, k))
    assert layer.decision(1, mx.float32)[0] == "mlx_qmm"
    np.testing.assert_array_equal(np.array(layer(x)), [[k, k]])
    layer.kernel = "exact"
    with pytest.raises(ValueError, match=r"'exact'.*K = 133152.*K <= 132104"):
        layer(x)


def test_a_converted_8bit_layer_gives_all_zero_groups_exactly(rng):
    # An mlx-lm 8-bit checkpoint stores an all-zero group as codes 0 with scale -1e-7:
    # converted as it was stored, the exact W8A8 kernel's fold s P + (b + 128 s) R left
    # about 1e-11 where mx.quantized_matmul gives 0. The conversion gives such groups
    # scale 0, which changes no weight (every code is 0, so w = b).
    k, gs = 1024, 64
    w = rng.standard_normal((4, k)).astype(np.float32)
    w[1] = 0.0
    w[3, : k // 2] = 0.0
    stock = nn.QuantizedLinear(k, 4, bias=False, group_size=gs, bits=8)
    stock.weight, stock.scales, stock.biases = mx.quantize(mx.array(w), group_size=gs, bits=8)
    assert float(mx.min(stock.scales[1])) < 0  # MLX's stored scale of an all-zero group
    layer = w8.Linear.from_linear(stock)
    assert layer.format == "grouped"
    np.testing.assert_array_equal(np.array(layer.quantized_weight.dequantize()),
                                  np.array(mx.dequantize(stock.weight, stock.scales,
                                                         stock.biases, gs, 8)))
    layer.kernel = "exact"
    x = mx.array(rng.standard_normal((5, k)).astype(np.float32))
    y = np.array(layer(x))
    np.testing.assert_array_equal(y[:, 1], np.zeros(5))
    want, bound = oracle.linear(oracle.to_numpy(x), layer.quantized_weight, None)
    oracle.assert_close(layer(x), want, bound, "float32")


# --- act_scales ------------------------------------------------------------------------


def test_act_scales_group_runs_the_activation_group_math(rng):
    from mlx_w8a8.kernels import reference

    for bits in (8, 4):
        layer = w8.Linear(256, 40, per_channel=False, bits=bits, act_scales="group")
        layer.kernel = "exact_act_groups"
        x = mx.array(rng.standard_normal((3, 5, 256)).astype(np.float32))
        x[..., 7] = 200.0
        want = reference.act_groups_linear(x.reshape(15, 256), layer.quantized_weight, layer.bias)
        np.testing.assert_array_equal(np.array(layer(x)).reshape(15, 40), np.array(want))
        assert layer.problem(15).act_scales == "group" and "act_scales='group'" in repr(layer)
        layer.kernel = "exact" if bits == 8 else "exact_w4a8"  # per-token only: refused
        with pytest.raises(ValueError, match="per token only"):
            layer(x)


def test_act_scales_is_validated_and_re_decides():
    with pytest.raises(ValueError, match="needs group-wise weights"):
        w8.Linear(128, 8, act_scales="group")  # per-channel by default
    layer = w8.Linear(128, 8, per_channel=False)
    with pytest.raises(ValueError, match=r"act_scales must be one of \('token', 'group'\)"):
        layer.act_scales = "channel"
    x = mx.ones((2, 128))
    layer.kernel = "exact"
    mx.eval(layer(x))
    assert layer.decision(2)[0] == "exact"
    layer.act_scales = "group"  # the kept plan is dropped: exact refuses it now
    with pytest.raises(ValueError, match="per token only"):
        layer(x)
    layer.kernel = None  # no rule or entry chose a W8A8 kernel here: W8A16 falls back
    assert layer.decision(2)[0] in ("mlx_qmm", "exact_act_groups")


def test_outliers_keep_their_channels_out_of_the_int8_activations(rng):
    # exact W8A8 on x with the channels zeroed, plus those channels times the dequantized
    # weight columns in x's dtype, against the float64 oracle of that formula; a planted
    # channel 500x the rest no longer coarsens every token's codes. Also 4-bit weights.
    for bits, per_channel in ((8, True), (8, False), (4, False)):
        layer = w8.Linear(256, 40, per_channel=per_channel, bits=bits)
        layer.bias = mx.array(rng.standard_normal(40).astype(np.float32))
        layer.kernel = "exact" if bits == 8 else "exact_w4a8"
        x = rng.standard_normal((3, 5, 256)).astype(np.float32)
        x[..., 7] = 500.0 * rng.choice([-1, 1], size=(3, 5))
        x[1, 2] = 0.0  # an all-zero token stays exact
        xs = mx.array(x)
        before = np.array(layer(xs))
        layer.outliers = [7, 200]
        got = np.array(layer(xs))
        np.testing.assert_array_equal(np.array(layer(xs)), got)  # the kept plan: same bits
        qw = layer.quantized_weight
        deq = np.array(qw.dequantize(), dtype=np.float64)
        main = x.reshape(15, 256).copy()
        main[:, [7, 200]] = 0
        if bits == 4:
            want, bound = oracle.linear4(main, qw, np.array(layer.bias))
        else:
            want, bound = oracle.linear(main, qw, np.array(layer.bias))
        out = x.reshape(15, 256)[:, [7, 200]].astype(np.float64) @ deq[:, [7, 200]].T
        want = want + out
        bound = bound + 1e-6 * (np.abs(x.reshape(15, 256)[:, [7, 200]]) @ np.abs(deq[:, [7, 200]]).T)
        oracle.assert_close(mx.array(got.reshape(15, 40)), want, bound, "float32")
        exact = x.reshape(15, 256).astype(np.float64) @ deq.T + np.array(layer.bias)
        assert np.abs(got.reshape(15, 40) - exact).max() < 0.1 * np.abs(before.reshape(15, 40) - exact).max()
        assert "outliers=2" in repr(layer) and layer.outliers == (7, 200)


def test_outliers_leave_w8a16_kernels_as_they_are(rng):
    # mx.quantized_matmul quantizes no activation: its plan is not split (same bits)
    layer = w8.Linear(128, 24)
    layer.kernel = "mlx_qmm"
    x = mx.array(rng.standard_normal((4, 128)).astype(np.float32))
    before = np.array(layer(x))
    layer.outliers = (3,)
    np.testing.assert_array_equal(np.array(layer(x)), before)


def test_outliers_are_validated_and_re_decide():
    layer = w8.Linear(128, 8)
    for bad in ([128], [-1], [3, 3], [], [True], [1.5], "ab", 7, list(range(65))):
        with pytest.raises(ValueError, match=r"outliers must be None or distinct channel indices in \[0, 128\)"):
            layer.outliers = bad
    layer.outliers = np.array([9, 2])  # numpy integers too, kept sorted
    assert layer.outliers == (2, 9)
    layer.kernel = "exact"
    x = mx.ones((2, 128))
    x[:, 2] = 300.0
    kept = np.array(layer(x))
    mx.eval(layer(x))
    assert layer._plans  # kept from the second call
    layer.outliers = None
    assert not layer._plans  # dropped: the next call plans again
    # channel 2 back in the int8 rows: the ones round to code 0 at scale 300 / 127
    assert not np.array_equal(np.array(layer(x)), kept)


def test_layers_with_the_same_outliers_share_the_masked_input(tables):
    # q/k/v fed one x with the same outlier channels quantize one masked array once (the
    # shared activations are keyed by the array); siblings with different channels are
    # not compatible (one launch reads one masked input)
    from mlx_w8a8 import siblings

    quantized = []

    def quantize(x):
        quantized.append(x.shape)
        return x

    def apply(acts, w, b, dtype):
        return QMM.run(acts, w, b).astype(dtype)

    registry.register(Candidate(name="staged", backend="any", op="linear",
                                run=lambda x, w, b: apply(quantize(x), w, b, x.dtype),
                                stages=lambda p: (("fake", p.k), quantize, apply)))
    q, k, v = (w8.Linear(64, n, group_size=32) for n in (32, 16, 16))
    for layer in (q, k, v):
        layer.kernel = "staged"
        layer.outliers = (5, 9)
    w8nn.clear_shared_activations()
    x = mx.ones((2, 3, 64))
    mx.eval([layer(x) for layer in (q, k, v)])
    assert len(quantized) == 1
    assert siblings.compatible([q, k, v])
    v.outliers = (5,)
    assert not siblings.compatible([q, k, v])
