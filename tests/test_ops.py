"""The public ops against the numpy oracle (reference candidates, on this machine's
default device)."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_w8a8 as w8
from mlx_w8a8.kernels import registry
import oracle

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


# --- int8_matmul ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "m, n, k",
    [
        (1, 496, 33),  # M = 1: decode; K = 33: not a multiple of 4, 8, 16 or 32 (no tile fits)
        (31, 64, 255),  # M just under a 32-row tile; K one short of 256
        (33, 496, 513),  # M one past 32; N = 496 not a power of two; K one past a 512 tile
        (129, 17, 1024),  # M one past 128; K exactly one exact float32 chunk (2^10)
        (2, 8, 1025),  # K one past the chunk: the int32 carry between chunks is used
        (3, 5, 4097),  # K = 4097: five chunks, the last of one column
    ],
)
def test_int8_matmul_bit_exact(rng, m, n, k):
    a = oracle.random_int8(rng, (m, k))
    b = oracle.random_int8(rng, (n, k))
    got = w8.int8_matmul(mx.array(a), mx.array(b))
    assert got.dtype == mx.int32 and got.shape == (m, n)
    np.testing.assert_array_equal(np.array(got), oracle.int8_matmul(a, b))


def test_int8_matmul_large_sums_stay_exact(monkeypatch):
    # Sums past 2^24 made of products that are not multiples of a large power of two:
    # an unchunked float32 accumulation rounds them (all 127: 16129 * K), so this is
    # where the exact kernel's K-chunking matters. -128 * -128 = 2^14 products alone
    # would not tell: their sums are exact in float32 without chunking.
    from mlx_w8a8.kernels import reference

    rng = np.random.default_rng(7)
    k = 8192
    a = np.full((3, k), 127, np.int8)
    a[1, ::3] = -128  # mixed signs and magnitudes
    a[2] = rng.integers(-128, 128, k)
    b = np.full((4, k), 127, np.int8)
    b[1] = -128
    b[2, ::8] = 126  # 127 with a sparse 126: odd, non-uniform products
    b[3] = rng.integers(-128, 128, k)
    want = oracle.int8_matmul(a, b)
    assert want[0, 0] == 127 * 127 * k > 2**24
    got = np.array(w8.int8_matmul(mx.array(a), mx.array(b), kernel="exact"))
    np.testing.assert_array_equal(got, want)
    # The same check catches the mutant that sums all of K in one float32 matmul.
    monkeypatch.setattr(reference, "EXACT_CHUNK", 1 << 20)
    mutant = np.array(w8.int8_matmul(mx.array(a), mx.array(b), kernel="exact"))
    assert not np.array_equal(mutant, want)


def test_int8_matmul_refuses_k_where_int32_can_overflow():
    # K = 2^17 products of -128 * -128 sum to 2^31, one past the int32 maximum: refused
    # (docs/numerics.md promises exactness for K < 2^17); K = 2^17 - 1 is the largest.
    k = 1 << 17
    with pytest.raises(ValueError, match=r"int8_matmul.*K = 131072 is too large.*K < 2\^17"):
        w8.int8_matmul(mx.full((1, k), -128, mx.int8), mx.full((1, k), -128, mx.int8))
    a = mx.full((1, k - 1), -128, mx.int8)
    got = w8.int8_matmul(a, a, kernel="exact")
    assert int(got.item()) == (k - 1) * 2**14 == 2**31 - 2**14


def test_int8_matmul_empty_dimensions_give_empty_or_zero():
    # M = 0 appears with empty batches; K = 0 is the empty sum (zeros), as numpy has it.
    assert w8.int8_matmul(mx.zeros((0, 8), mx.int8), mx.zeros((4, 8), mx.int8)).shape == (0, 4)
    z = w8.int8_matmul(mx.zeros((2, 0), mx.int8), mx.zeros((3, 0), mx.int8))
    np.testing.assert_array_equal(np.array(z), np.zeros((2, 3), np.int32))


# --- quantize_activation -------------------------------------------------------------
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_quantize_activation_matches_oracle_bit_for_bit(rng, dtype):
    x = mx.array(rng.standard_normal((7, 3, 96)).astype(np.float32) * 3).astype(DTYPES[dtype])
    q, s = w8.quantize_activation(x)
    assert q.dtype == mx.int8 and q.shape == (7, 3, 96)
    assert s.dtype == mx.float32 and s.shape == (7, 3, 1)
    want_q, want_s = oracle.quantize_rows(oracle.to_numpy(x).reshape(21, 96))
    np.testing.assert_array_equal(np.array(q).reshape(21, 96), want_q)
    np.testing.assert_array_equal(np.array(s).reshape(21, 1), want_s)


def test_quantize_activation_ties_round_half_to_even():
    # x / scale lands exactly on .5: half-to-even (2.5 -> 2) is the contract; a kernel
    # rounding half away from zero would differ here and only here.
    x = mx.array([[127.0, 2.5, -2.5, 3.5, 0.5]])
    q, s = w8.quantize_activation(x)
    assert float(s.item()) == 1.0
    np.testing.assert_array_equal(np.array(q)[0], [127, 2, -2, 4, 0])


def test_quantize_activation_zero_and_nonfinite_rows(rng):
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[1] = 0.0  # padding tokens: must give zeros, not 0/0 = NaN
    x[2, 5] = np.nan  # a NaN must poison its own row only
    x[3, 7] = np.inf
    q, s = w8.quantize_activation(mx.array(x))
    q, s = np.array(q), np.array(s)
    assert s[1, 0] == 0.0 and not q[1].any()
    assert np.isnan(s[2, 0]) and np.isnan(s[3, 0])
    assert not q[2].any() and not q[3].any()
    want_q, want_s = oracle.quantize_rows(x[:1])
    np.testing.assert_array_equal(q[:1], want_q)
    np.testing.assert_array_equal(s[:1], want_s)


def test_quantize_activation_row_sums(rng):
    x = rng.standard_normal((5, 128)).astype(np.float32)
    q, s, r = w8.quantize_activation(mx.array(x), group_size=32)
    assert r.dtype == mx.int32 and r.shape == (5, 4)
    np.testing.assert_array_equal(np.array(r), np.array(q).astype(np.int64).reshape(5, 4, 32).sum(-1))


# --- w8a8_linear ----------------------------------------------------------------------
def _weight(rng, n, k, per_channel, group_size=64, dtype=mx.float32):
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32) * 0.05).astype(dtype)
    return w, w8.quantize_weight(w, group_size=group_size, per_channel=per_channel)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "grouped"])
@pytest.mark.parametrize("lead", [(1,), (33,), (2, 5)], ids=["M1", "M33", "3D"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_w8a8_linear_matches_oracle(rng, dtype, per_channel, lead, with_bias):
    n, k = 96, 192
    _, qw = _weight(rng, n, k, per_channel, dtype=DTYPES[dtype])
    x = mx.array(rng.standard_normal((*lead, k)).astype(np.float32)).astype(DTYPES[dtype])
    bias = mx.array(rng.standard_normal(n).astype(np.float32)).astype(DTYPES[dtype]) if with_bias else None
    y = w8.w8a8_linear(x, qw, bias, kernel="exact")
    assert y.dtype == DTYPES[dtype] and y.shape == (*lead, n)
    want, bound = oracle.linear(
        oracle.to_numpy(x).reshape(-1, k), qw, None if bias is None else oracle.to_numpy(bias)
    )
    oracle.assert_close(y.reshape(-1, n), want, bound, dtype)


@pytest.mark.parametrize("dtype, min_db", [("float32", 30.0), ("bfloat16", 30.0), ("float16", 30.0)])
def test_w8a8_linear_quantization_error_is_what_int8_explains(rng, dtype, min_db):
    # Against the float64 dense product the only error is int8 rounding of weights and
    # activations: ~0.3% relative per operand for Gaussian data, about 40 dB; a wrong
    # scale or a dropped group would collapse it far below the bound.
    n, k, m = 256, 512, 64
    w, qw = _weight(rng, n, k, True, dtype=DTYPES[dtype])
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(DTYPES[dtype])
    y = oracle.to_numpy(w8.w8a8_linear(x, qw, kernel="exact")).astype(np.float64)
    dense = oracle.to_numpy(x).astype(np.float64) @ oracle.to_numpy(w).astype(np.float64).T
    db = oracle.sqnr_db(dense, y)
    print(f"W8A8 per-channel SQNR vs float64 dense ({dtype}): {db:.1f} dB")
    assert db > min_db


def test_w8a8_linear_zero_and_nan_rows(rng):
    n, k = 32, 64
    _, qw = _weight(rng, n, k, True)
    bias = mx.array(rng.standard_normal(n).astype(np.float32))
    x = rng.standard_normal((3, k)).astype(np.float32)
    x[0] = 0.0
    x[2, 3] = np.nan
    y = np.array(w8.w8a8_linear(mx.array(x), qw, bias, kernel="exact"))
    np.testing.assert_array_equal(y[0], np.array(bias))  # zeros + bias, never NaN
    assert np.isfinite(y[1]).all()  # the neighbour row is untouched
    assert np.isnan(y[2]).all()


def test_default_dispatch_is_the_w8a16_reference(rng, monkeypatch):
    # No tuning table entry and no built-in prior rule (the prior picks the exact kernel
    # on MLX's CPU, see tuning/prior.py): mx.quantized_matmul on the same stored
    # weights runs.
    from mlx_w8a8.tuning import prior

    monkeypatch.setattr(prior, "RULES", {})
    _, qw = _weight(rng, 64, 128, True)
    x = mx.array(rng.standard_normal((4, 128)).astype(np.float32))
    got = w8.w8a8_linear(x, qw)
    want = mx.quantized_matmul(x, qw.q, qw.scales, qw.biases, group_size=64, bits=8)
    np.testing.assert_array_equal(np.array(got), np.array(want))


def test_mlx_qmm_matches_dequantized_float64(rng):
    _, qw = _weight(rng, 64, 128, False)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    y = np.array(w8.w8a8_linear(mx.array(x), qw, kernel="mlx_qmm"))
    want = x.astype(np.float64) @ np.array(qw.dequantize()).astype(np.float64).T
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_grouped_all_zero_weights_give_exactly_zero(rng):
    # MLX stores an all-zero group as codes 0, scale -1e-7, bias 0. The grouped W8A8
    # math s P + (b + 128 s) R, with P = -128 R there, is 0 only in exact arithmetic: the
    # exact kernel left ~1e-11 (mlx_qmm gives 0). Row 1 is all zero, row 2 half zero;
    # K = 1024 (16 groups) gives the float32 sums room to disagree.
    k, gs = 1024, 64
    w = rng.standard_normal((4, k)).astype(np.float32)
    w[1] = 0.0
    w[2, : k // 2] = 0.0
    qw = w8.quantize_weight(mx.array(w), group_size=gs, per_channel=False)
    assert qw.format == "grouped"
    # The weight is the one mx.quantize describes: zeroing a scale where every code is
    # 0 changes no dequantized value.
    q, s, b = mx.quantize(mx.array(w), group_size=gs, bits=8)
    np.testing.assert_array_equal(np.array(qw.dequantize()), np.array(mx.dequantize(q, s, b, gs, 8)))
    x = mx.array(rng.standard_normal((5, k)).astype(np.float32))
    y = oracle.to_numpy(w8.w8a8_linear(x, qw, kernel="exact"))
    np.testing.assert_array_equal(y[:, 1], np.zeros(5))
    want, bound = oracle.linear(oracle.to_numpy(x), qw, None)
    oracle.assert_close(w8.w8a8_linear(x, qw, kernel="exact"), want, bound, "float32")


# --- the K bound of the linear ops -----------------------------------------------------
def _worst_per_channel(k: int):
    """All-ones x (codes 127) against weight codes -128: the largest int32 sum a
    per-channel W8A8 kernel forms, 127 * 128 * K in magnitude."""
    w_i8 = mx.full((2, k), -128, mx.int8)
    qw = w8.QuantizedWeight.from_int8(w_i8, mx.array([1.0, 0.5]), group_size=32)
    return mx.ones((1, k)), qw


def test_linear_past_the_per_channel_k_bound_falls_to_qmm_or_refuses():
    # K = 133152 (a multiple of 32 past 132104 = (2^31 - 1) // (127 * 128)): the exact
    # kernel's int32 sum wrapped to -133136.5 where the product is 133152. The default
    # decision (the CPU prior picks the exact kernel for per-channel weights) must fall
    # to mx.quantized_matmul, and a forced W8A8 kernel must be refused, naming the bound.
    k = 133152
    qw = w8.quantize_weight(mx.ones((2, k)), group_size=32)
    x = mx.ones((1, k))
    np.testing.assert_array_equal(np.array(w8.w8a8_linear(x, qw)), [[k, k]])
    with pytest.raises(ValueError, match=r"linear.*'exact'.*K = 133152.*K <= 132104"):
        w8.w8a8_linear(x, qw, kernel="exact")
    problem = w8.ops.linear_problem(x, qw, False)
    assert [c.name for c in registry.candidates(problem)] == ["mlx_qmm"]
    # The registry holds every W8A8 candidate to it, whatever its own supports() says
    # (a backend's capability check need not know the bound); W8A16 ones are not held.
    anything = dict(backend="any", op="linear", run=None, supports=lambda p: True)
    w8a8_kernel = registry.Candidate(name="any_w8a8", w8a8=True, **anything)
    w8a16_kernel = registry.Candidate(name="any_w8a16", w8a8=False, **anything)
    assert not w8a8_kernel.handles(problem) and w8a16_kernel.handles(problem)
    x_at, qw_at = _worst_per_channel(132096)
    assert w8a8_kernel.handles(w8.ops.linear_problem(x_at, qw_at, False))


def test_linear_at_the_per_channel_k_bound_is_exact():
    # K = 132096, the largest multiple of 32 <= 132104: 127 * 128 * K = 2^31 - 2^17 - ...
    # still fits in int32, so the exact kernel runs and gives the float64 product; the
    # next multiple of 32 (132128) is refused. A bound taken from int8_matmul's K < 2^17
    # would refuse the first, one taken from |w| <= 127 (133144) would accept the second.
    k = 132096
    x, qw = _worst_per_channel(k)
    got = np.array(w8.w8a8_linear(x, qw, kernel="exact"))
    np.testing.assert_array_equal(got, [[-128.0 * k, -64.0 * k]])
    x, qw = _worst_per_channel(k + 32)
    with pytest.raises(ValueError, match=r"K = 132128.*K <= 132104"):
        w8.w8a8_linear(x, qw, kernel="exact")


def test_grouped_linear_has_no_k_bound():
    # Grouped kernels promote each group's int32 sum to float32: nothing overflows at
    # K = 133152, and the exact kernel stays a candidate there (a bound applied to every
    # format would refuse it). The tolerance is the float32 epilogue's, 2 gamma(2G + 4)
    # of docs/numerics.md with G = 4161 groups (all terms positive here).
    k, gs = 133152, 32
    rng = np.random.default_rng()
    w = rng.uniform(0.5, 1.0, (2, k)).astype(np.float32)
    qw = w8.quantize_weight(mx.array(w), group_size=gs, per_channel=False)
    assert qw.format == "grouped"
    x = np.ones((1, k), np.float32)
    want, _ = oracle.linear(x, qw, None)
    got = np.array(w8.w8a8_linear(mx.array(x), qw, kernel="exact")).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2 * (2 * (k // gs) + 4) * 2.0**-24)


# --- bad input ------------------------------------------------------------------------
def test_int8_matmul_rejects_bad_input():
    a = mx.zeros((4, 8), mx.int8)
    with pytest.raises(ValueError, match=r"int8_matmul.*b must be a 2-D \[N, K\] int8.*float32"):
        w8.int8_matmul(a, mx.zeros((4, 8)))  # float weights where int8 is expected
    with pytest.raises(ValueError, match=r"int8_matmul.*a must be.*int32"):
        w8.int8_matmul(mx.zeros((4, 8), mx.int32), a)
    with pytest.raises(ValueError, match=r"int8_matmul.*K mismatch.*\[4, 8\].*\[4, 9\]"):
        w8.int8_matmul(a, mx.zeros((4, 9), mx.int8))
    with pytest.raises(ValueError, match=r"int8_matmul.*b must be a 2-D.*shape \(8,\)"):
        w8.int8_matmul(a, mx.zeros((8,), mx.int8))  # 1-D weights


def test_w8a8_linear_rejects_bad_input(rng):
    _, qw = _weight(rng, 16, 64, True)
    x = mx.zeros((2, 64))
    with pytest.raises(ValueError, match=r"w8a8_linear.*x must be a float16, bfloat16 or float32.*int8"):
        w8.w8a8_linear(mx.zeros((2, 64), mx.int8), qw)  # integer activations
    with pytest.raises(ValueError, match=r"w8a8_linear.*K mismatch.*32.*\[16, 64\]"):
        w8.w8a8_linear(mx.zeros((2, 32)), qw)
    with pytest.raises(ValueError, match=r"w8a8_linear.*weight must be a QuantizedWeight.*float32 array"):
        w8.w8a8_linear(x, mx.zeros((16, 64)))  # a float weight passed unquantized
    with pytest.raises(ValueError, match=r"w8a8_linear.*bias must be.*\[16\].*\(17,\)"):
        w8.w8a8_linear(x, qw, mx.zeros((17,)))
    with pytest.raises(ValueError, match=r"unknown kernel 'nope'.*mlx_qmm"):
        w8.w8a8_linear(x, qw, kernel="nope")


def test_quantize_activation_of_no_rows_is_empty_and_chooses_nothing(monkeypatch):
    # M = 0 comes with empty batches: empty outputs of the right shapes and dtypes, and no
    # kernel decision (the tuner buckets M >= 1 only; it once printed a chooser failure).
    def refuse(*args, **kwargs):
        raise AssertionError("no kernel is chosen for M = 0")
    monkeypatch.setattr(registry, "choose", refuse)
    q, s, r = w8.quantize_activation(mx.zeros((2, 0, 128), mx.bfloat16), group_size=64)
    assert (q.shape, s.shape, r.shape) == ((2, 0, 128), (2, 0, 1), (2, 0, 2))
    assert (q.dtype, s.dtype, r.dtype) == (mx.int8, mx.float32, mx.int32)
    q, s = w8.quantize_activation(mx.zeros((0, 8)))
    assert (q.shape, s.shape) == ((0, 8), (0, 1))


def test_quantize_activation_rejects_bad_input():
    # K = 0: a row without elements has no max|x| to take a scale from.
    with pytest.raises(ValueError, match=r"quantize_activation.*K >= 1.*\(3, 0\)"):
        w8.quantize_activation(mx.zeros((3, 0)))
    with pytest.raises(ValueError, match=r"quantize_activation.*x must be.*int32"):
        w8.quantize_activation(mx.zeros((2, 64), mx.int32))
    with pytest.raises(ValueError, match=r"quantize_activation.*group_size 64 does not divide K = 96"):
        w8.quantize_activation(mx.zeros((2, 96)), group_size=64)
    with pytest.raises(ValueError, match=r"quantize_activation.*group_size must be one of.*got 48"):
        w8.quantize_activation(mx.zeros((2, 96)), group_size=48)


def test_ops_take_a_stream_like_mlx_ops(rng):
    # A stream (or device) argument runs the op there; the result is the same math.
    x = mx.array(rng.standard_normal((3, 64)).astype(np.float32))
    w = w8.quantize_weight(mx.array(rng.standard_normal((16, 64)).astype(np.float32)), group_size=32)
    s = mx.new_stream(mx.cpu)
    for where in (s, mx.cpu):
        np.testing.assert_array_equal(
            np.array(w8.w8a8_linear(x, w, kernel="exact", stream=where)),
            np.array(w8.w8a8_linear(x, w, kernel="exact")))
        q, sc = w8.quantize_activation(x, stream=where)
        c = w8.int8_matmul(q, w.int8(), stream=where)
        assert c.dtype == mx.int32 and sc.shape == (3, 1)

    seen = []
    real = registry._decide
    registry.invalidate()  # decisions are kept: make the next call decide again
    try:
        registry._decide = lambda p, k=None: seen.append(mx.default_stream(mx.default_device())) or real(p, k)
        w8.int8_matmul(q, w.int8(), stream=s)
    finally:
        registry._decide = real
    assert seen == [s]  # the kernel was chosen with the given stream current


# --- decide once, bind once -----------------------------------------------------------
def test_ops_decide_once_per_problem_until_the_registry_moves(rng, monkeypatch):
    # The decision (a table lookup, the prior) is made on the first call per problem and
    # device and reused; a registry change (a table loaded, a candidate registered, a
    # measurement recorded) makes every op decide again, as mlx_w8a8.Linear does.
    from mlx_w8a8.kernels import registry

    calls = []  # the decisions made (registry.decide keeps them: registry._decide makes one)
    real = registry._decide
    monkeypatch.setattr(registry, "_decide",
                        lambda p, k=None: calls.append((p.op, p.m)) or real(p, k))
    x = mx.array(rng.standard_normal((3, 64)).astype(np.float32))
    w = w8.quantize_weight(mx.array(rng.standard_normal((16, 64)).astype(np.float32)))
    registry.invalidate()
    for _ in range(3):
        w8.w8a8_linear(x, w)
        q, _ = w8.quantize_activation(x)
        w8.int8_matmul(q, w.int8())
    assert calls == [("linear", 3), ("quantize_activation", 3), ("int8_matmul", 3)]
    w8.w8a8_linear(x[:2], w)  # another M is another problem
    assert calls[-1] == ("linear", 2) and len(calls) == 4
    registry.invalidate()
    w8.w8a8_linear(x, w)
    assert calls[-1] == ("linear", 3) and len(calls) == 5
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        w8.w8a8_linear(x, w, kernel="nope")
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):  # failures are not kept
        w8.w8a8_linear(x, w, kernel="nope")


def test_w8a8_linear_binds_once_per_weight_and_bias(rng):
    # A candidate with bound launches (the CUDA GEMMs) is bound to a weight and bias on the
    # second call with them (the first runs the candidate's run and keeps nothing: an
    # activation shape met once leaves nothing behind), and the bound launches are kept
    # on the weight; another weight, or another bias array (even with the same values),
    # is bound anew. Outputs as the exact kernel's.
    import attrs
    from mlx_w8a8.kernels import registry

    exact = registry.get("linear", "exact")
    binds = []

    def bind_stages(problem, weight, bias, lead=None):
        binds.append((problem.m, id(weight), None if bias is None else id(bias)))
        return None, None, lambda x2: exact.run(x2, weight, bias)

    registry.register(attrs.evolve(exact, name="bound_fake", bind_stages=bind_stages))
    try:
        x = mx.array(rng.standard_normal((4, 64)).astype(np.float32))
        w1, w2 = (w8.quantize_weight(mx.array(rng.standard_normal((16, 64)).astype(np.float32)))
                  for _ in range(2))
        b1, b2 = (mx.array(rng.standard_normal(16).astype(np.float32)) for _ in range(2))

        def check(w, b):
            got = w8.w8a8_linear(x, w, b, kernel="bound_fake")
            np.testing.assert_array_equal(np.array(got), np.array(w8.w8a8_linear(x, w, b, kernel="exact")))

        check(w1, None)
        assert binds == [] and not w1._plans.plans  # met once: nothing kept
        check(w1, None), check(w1, None)
        assert len(binds) == 1
        for w, b in ((w2, None), (w1, b1), (w1, b2)):
            check(w, b), check(w, b), check(w, b)
        assert len(binds) == 4  # w2; w1 with b1; w1 with b2
        b1_again = mx.array(np.array(b1))
        check(w1, b1_again), check(w1, b1_again)
        assert len(binds) == 5
        for _ in range(3):  # [..., K]: another key, kept (and bound) from its second call
            y = w8.w8a8_linear(x.reshape(2, 2, 64), w1, kernel="bound_fake")
            assert y.shape == (2, 2, 16)
        assert len(binds) == 6
    finally:
        registry.unregister("linear", "bound_fake")


def test_w8a8_linear_remembers_shapes_met_once_up_to_a_bound(rng, monkeypatch):
    # Ever-new activation shapes (a server's prompt lengths) keep no call and no bound
    # launches; their keys start over at plans.LIMIT instead of growing.
    from mlx_w8a8 import plans

    monkeypatch.setattr(plans, "LIMIT", 3)
    w = w8.quantize_weight(mx.array(rng.standard_normal((16, 64)).astype(np.float32)))
    for m in range(1, 8):
        x = mx.array(rng.standard_normal((m, 64)).astype(np.float32))
        np.testing.assert_array_equal(np.array(w8.w8a8_linear(x, w, kernel="exact")),
                                      np.array(registry_run("exact", x, w)))
        assert len(w._plans._met) <= 3 and not w._plans.plans
    w8.w8a8_linear(x, w, kernel="exact")  # M = 7 met just before: kept now
    assert len(w._plans.plans) == 1


def registry_run(name, x, w):
    from mlx_w8a8.kernels import registry

    return registry.get("linear", name).run(x, w, None)


def test_w8a8_linear_repeated_call_still_refuses_bad_input(rng):
    # A repeated call takes the entry kept for its activation shape, dtype, bias and
    # kernel; an input that was never checked (a numpy array of the same shape, another
    # K, a bias of the wrong shape) finds none and is refused as on a first call.
    w = w8.quantize_weight(mx.array(rng.standard_normal((16, 64)).astype(np.float32)))
    x = rng.standard_normal((4, 64)).astype(np.float32)
    want = np.array(w8.w8a8_linear(mx.array(x), w, kernel="exact"))
    np.testing.assert_array_equal(np.array(w8.w8a8_linear(mx.array(x), w, kernel="exact")), want)
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.w8a8_linear\] x must be"):
        w8.w8a8_linear(x, w, kernel="exact")
    with pytest.raises(ValueError, match="K mismatch"):
        w8.w8a8_linear(mx.array(x[:, :32]), w, kernel="exact")
    with pytest.raises(ValueError, match="bias must be"):
        w8.w8a8_linear(mx.array(x), w, mx.zeros((8,)), kernel="exact")
    with pytest.raises(ValueError, match="weight must be a QuantizedWeight"):
        w8.w8a8_linear(mx.array(x), w.q, kernel="exact")
