"""The subnormal promotion (``cuda_w8a8_gemm_subnormal``, ``cuda_w4a8_gemm_subnormal``:
``gemm_grouped_ws.cu`` bodies ``tma_subnormal*``) without a GPU: the terms array its
launches read (:func:`gemm_grouped.subnormal_terms`), decoded as the kernel reads it,
and a float32 model of the kernel's arithmetic on those terms against the float64 oracle
within the form's bound (``docs/numerics.md``), with mutants the model must fail.

The model follows the kernel step by step: per offset block one k16 step of the pieces
accumulated into ``f`` (each product exact; the sum with ``f`` rounded once to float32
here, the bound allowing two roundings per term); then per group of the block one
``fma`` of the int32 sum ``U = sum (a + 128) q`` read as the subnormal ``U 2^-149`` times
``S_n`` into ``f``; at the tile's end the product by ``t_m`` and the column scale.
"""

from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx

import oracle
from kernel_recorder import fake_tensor_maps, record_launches
from mlx_w8a8 import QuantizedWeight
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.cuda import gemm_grouped, launch, tiles
from mlx_w8a8.tuning import gate


def make_weight(rng, n, k, group_size, bits, dtype="bfloat16"):
    """Rows with a non-zero mean (the bias term matters), one row of zeros (all-zero
    groups), one row far larger than the rest (its column scale differs)."""
    w = rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)
    w += rng.uniform(-0.05, 0.05, (n, 1)).astype(np.float32)
    w[n // 2] = 0.0
    w[1] *= 300.0
    return QuantizedWeight.from_float(mx.array(w).astype(getattr(mx, dtype)),
                                      group_size=group_size, per_channel=False, bits=bits)


def activation(rng, m, k):
    x = rng.standard_normal((m, k)).astype(np.float32) * rng.uniform(0.01, 10, (m, 1))
    x[0, 3] = 500.0  # an outlier: small codes elsewhere in the row
    if m > 2:
        x[2] = 0.0
    return x.astype(np.float32)


def bf16_values(words: np.ndarray) -> np.ndarray:
    """Float32 words holding two bfloat16 each (the lower in the low half) -> float64."""
    u = words.view(np.uint32)
    lo = (u & 0xFFFF).astype(np.uint32) << 16
    hi = u & 0xFFFF0000
    return np.stack([lo.view(np.float32), hi.view(np.float32)], -1).reshape(-1).astype(np.float64)


def decode(weight, bn):
    """``(S [tiles, G, bn], pieces [tiles, blocks, bn, 16], col_scale [tiles * bn])`` from
    the terms array, each read at the offsets the kernel computes (tile_terms,
    load_stage_terms, the epilogue's col_scale)."""
    n, gs = weight.n, weight.group_size
    g = weight.k // gs
    gb = tiles.sub_groups(gs)
    blocks = -(-g // gb)
    nt = -(-n // bn)
    terms = np.array(gemm_grouped.subnormal_terms(weight, bn))
    s_words = nt * g * bn // 2  # S: bfloat16, two to a float32 (subnormal_s)
    assert terms.dtype == np.float32 and terms.size == s_words + nt * bn * (blocks * 8 + 1)
    s_sec = bf16_values(terms[:s_words]).reshape(nt, g, bn)
    p_words = terms[s_words: s_words + nt * blocks * 8 * bn]
    # wgmma_desc_plain: core matrix (8 rows x 8 values) of row group nb and k half kh at
    # 256 nb + 128 kh bytes, row r at 16 r, value e at 2 e.
    p = bf16_values(p_words).reshape(nt, blocks, bn // 8, 2, 8, 8)
    pieces = p.transpose(0, 1, 2, 4, 3, 5).reshape(nt, blocks, bn, 16)
    col = terms[s_words + nt * blocks * 8 * bn:].astype(np.float64)
    assert col.size == nt * bn
    return s_sec, pieces, col


def a_pieces(r: np.ndarray, g0: int, gb: int, groups: int, swap=False) -> np.ndarray:
    """The A operand of one block's k16 step for rows with group sums ``r`` ``[M, G]``:
    ``[M, 16]`` as ``piece_pair`` builds it."""
    m = r.shape[0]
    a = np.zeros((m, 16))
    for i in range(gb):
        if g0 + i < groups:
            v = r[:, g0 + i].astype(np.int64)
            hi, lo = v >> 7, v & 127
            a[:, 2 * i], a[:, 2 * i + 1] = (lo, hi) if swap else (hi, lo)
    a[:, 2 * gb: 2 * gb + 3] = 1.0
    return a


def model(x, weight, bias, bn, ftz=False, swap=False, drop_group=None):
    """The kernel's float32 arithmetic on the decoded terms (module docstring)."""
    n, k, gs = weight.n, weight.k, weight.group_size
    g = k // gs
    gb = tiles.sub_groups(gs)
    q, t = oracle.quantize_rows(x)
    m = q.shape[0]
    u = q.astype(np.int64) + 128  # the sums_u8 codes
    c = (oracle.codes(weight) if weight.bits == 8 else oracle.codes4(weight)).astype(np.int64)
    r = q.astype(np.int64).reshape(m, g, gs).sum(-1)
    s_sec, pieces, col = decode(weight, bn)
    s_full = s_sec.transpose(0, 2, 1).reshape(-1, g)[:n]  # [N, G]
    p_full = pieces.transpose(0, 2, 1, 3).reshape(-1, pieces.shape[1], 16)[:n]  # [N, blocks, 16]
    f = np.zeros((m, n), np.float32)
    for blk in range(p_full.shape[1]):
        a = a_pieces(r, blk * gb, gb, g, swap)
        f = (f.astype(np.float64) + a @ p_full[:, blk, :].T).astype(np.float32)
        for j in range(blk * gb, min(g, (blk + 1) * gb)):
            if j == drop_group:
                continue
            d = u[:, j * gs:(j + 1) * gs] @ c[:, j * gs:(j + 1) * gs].T  # int32 sums, >= 0
            assert d.min() >= 0 and d.max() < 2**23
            sub = 0.0 if ftz else np.ldexp(d.astype(np.float64), -149)
            f = (f.astype(np.float64) + sub * s_full[None, :, j]).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        y = (f.astype(np.float64) * t.astype(np.float32)).astype(np.float32)
        y = (y.astype(np.float64) * col[:n][None, :]).astype(np.float32)
    if bias is not None:
        y = (y.astype(np.float64) + bias.astype(np.float32)[None, :]).astype(np.float32)
    return y.astype(np.float64)


def within(y, want, bound):
    ok = np.isnan(want) | (np.abs(y - want) <= bound)
    return bool(np.all(ok))


CASES = [  # M, N, K, group size, bits, tile width
    (5, 96, 1024, 64, 8, 64),     # N past the last tile's columns; G = 16: a partial block
    (7, 130, 768, 128, 8, 128),   # G = 6: one whole block; N a column past a tile
    (3, 64, 512, 32, 8, 64),      # GB = 4 at group size 32
    (6, 128, 1152, 64, 4, 128),   # 4-bit codes, G = 18: three blocks
    (4, 72, 896, 128, 4, 128),    # 4-bit, G = 7: a block of one group
]


@pytest.mark.parametrize("m,n,k,gs,bits,bn", CASES)
def test_terms_hold_the_weight_exactly(rng, m, n, k, gs, bits, bn):
    """S 2^-E_n is the stored scale, the pieces' b' 2^(149 - E_n) the stored bias, the
    block constants -128 sum s Q to float32 accuracy, zeros elsewhere and past N."""
    del m
    weight = make_weight(rng, n, k, gs, bits)
    s_sec, pieces, col = decode(weight, bn)
    g, gb = k // gs, tiles.sub_groups(gs)
    s = oracle.to_numpy(weight.scales).astype(np.float64)
    b = oracle.to_numpy(weight.biases).astype(np.float64)
    unscale = col[:n] * 2.0**-149  # 2^-E_n, a power of two
    assert np.all(np.frexp(col[:n])[0] == 0.5)
    s_full = s_sec.transpose(0, 2, 1).reshape(-1, g)
    np.testing.assert_array_equal(s_full[:n] * unscale[:, None], s)
    assert np.all(s_full[n:] == 0) and np.all(col[n:] == 0)
    assert np.abs(s_full).max() < 2.0**126
    p_full = pieces.transpose(0, 2, 1, 3).reshape(-1, pieces.shape[1], 16)
    assert np.all(p_full[n:] == 0)
    back = 2.0**149 * unscale  # 2^(149 - E_n)
    codes = (oracle.codes(weight) if bits == 8 else oracle.codes4(weight)).astype(np.float64)
    q_sum = codes.reshape(n, g, gs).sum(-1)
    for blk in range(p_full.shape[1]):
        grp = range(blk * gb, min(g, (blk + 1) * gb))
        for i, j in enumerate(grp):
            np.testing.assert_array_equal(p_full[:n, blk, 2 * i + 1] * back, b[:, j])
            np.testing.assert_array_equal(p_full[:n, blk, 2 * i], 128.0 * p_full[:n, blk, 2 * i + 1])
        assert np.all(p_full[:n, blk, 2 * len(grp): 2 * gb] == 0)  # groups past G
        const = p_full[:n, blk, 2 * gb: 2 * gb + 3].sum(-1) * back
        want = -128.0 * (s[:, list(grp)] * q_sum[:, list(grp)]).sum(-1)
        np.testing.assert_allclose(const, want, rtol=2.0**-21, atol=0)
        assert np.all(p_full[:n, blk, 2 * gb + 3:] == 0)


@pytest.mark.parametrize("m,n,k,gs,bits,bn", CASES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_model_is_within_the_subnormal_bound(rng, m, n, k, gs, bits, bn, with_bias):
    """The kernel's arithmetic on the terms array lies within ``gamma(2G + 4) T +
    gamma(n_s) T_s`` of the float64 oracle (oracle.linear_subnormal), for the pieces as
    built and read; the mutants a kernel could carry do not (below)."""
    weight = make_weight(rng, n, k, gs, bits)
    x = activation(rng, m, k)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    want, bound = oracle.linear_subnormal(x, weight, bias)
    assert within(model(x, weight, bias, bn), want, bound)


@pytest.mark.parametrize("mutant", ["ftz", "swap", "drop"])
def test_mutants_leave_the_bound(rng, mutant):
    """Flushing the subnormal (an fma with .ftz), the A pieces' hi / lo swapped, one
    group's promotion dropped: each leaves the bound the correct model keeps."""
    m, n, k, gs, bits, bn = 6, 128, 1024, 64, 8, 128
    weight = make_weight(rng, n, k, gs, bits)
    x = activation(rng, m, k)
    want, bound = oracle.linear_subnormal(x, weight, None)
    assert within(model(x, weight, None, bn), want, bound)
    kw = {"ftz": {"ftz": True}, "swap": {"swap": True}, "drop": {"drop_group": 5}}[mutant]
    assert not within(model(x, weight, None, bn, **kw), want, bound)


def test_gate_bound_of_the_form(rng):
    """``w8a8_bound(form="subnormal")`` on the device matches the oracle's allowance
    (float32 against float64) and exceeds the epilogue form's; unknown forms and
    per-channel weights are refused by name."""
    weight = make_weight(rng, 96, 512, 64, 8)
    x = activation(rng, 5, 512)
    _, bound = oracle.linear_subnormal(x, weight, None)
    _, bound_epi = oracle.linear(x, weight, None)
    sub = gate.w8a8_bound(mx.array(x), weight, None, form="subnormal").host()
    epi = gate.w8a8_bound(mx.array(x), weight, None).host()
    rows = np.abs(x).max(axis=1) > 0  # an all-zero row has both bounds 0
    # gamma(n_s) T_s: the oracle's in float64, the gate's float32 sums times its factor
    # (1 + gamma(K + 2)) (1 + 2^-9) beside the reference's half of the epilogue allowance.
    np.testing.assert_allclose((sub - epi / 2)[rows], (bound - bound_epi)[rows], rtol=3e-3)
    assert np.all(sub[rows] >= epi[rows]) and np.any(sub[rows] > 10 * epi[rows])
    with pytest.raises(ValueError, match="form must be"):
        gate.w8a8_bound(mx.array(x), weight, None, form="fast")
    pc = QuantizedWeight.from_float(mx.array(rng.standard_normal((8, 64)).astype(np.float32)),
                                    per_channel=True)
    with pytest.raises(ValueError, match="subnormal form"):
        gate.w8a8_bound(mx.array(x[:, :64]), pc, None, form="subnormal")


def test_candidates_declare_their_form_and_dtype():
    """Both candidates are registered with bound_form "subnormal" (the others keep the
    epilogue's), refuse float16 activations and, through their terms, weights whose
    scales are not bfloat16."""
    for name in ("cuda_w8a8_gemm_subnormal", "cuda_w4a8_gemm_subnormal"):
        assert registry.get("linear", name).bound_form == "subnormal"
    assert registry.get("linear", "cuda_w8a8_gemm_grouped_tma").bound_form == "epilogue"
    kernel = gemm_grouped.W8A8GemmSubnormal()
    p = registry.Problem("linear", 64, 256, 1024, "float16", "grouped", 64)
    assert any(w and "bfloat16" in w for w in kernel.refusals(p) if w is not None)
    w16 = QuantizedWeight.from_float(mx.array(np.ones((8, 128), np.float32)).astype(mx.float16),
                                     group_size=64, per_channel=False)
    with pytest.raises(ValueError, match="bfloat16 scales"):
        gemm_grouped.subnormal_terms(w16, 64)


def test_weights_without_bfloat16_scales_run_the_epilogue_form(rng, monkeypatch):
    """A weight with float16 or float32 scales (bfloat16 activations) runs the group-wise
    TMA GEMM of the epilogue form on the same quantize's codes, flipped back to int8
    first (SignedCodes): the pieces could not hold its biases exactly. bfloat16 ones run
    the subnormal bodies."""
    from mlx_w8a8.kernels.cuda import tma as cuda_tma

    fake_tensor_maps(monkeypatch)  # the weight's map array needs the driver's prototypes
    record_launches(monkeypatch)  # kernel objects without MLX's CUDA backend
    launch._kernel.cache_clear()
    kernel = gemm_grouped.W8A8GemmSubnormal()
    p = registry.Problem("linear", 256, 256, 1024, "bfloat16", "grouped", 64)
    for dtype, sub in (("bfloat16", True), ("float16", False), ("float32", False)):
        w = make_weight(rng, 256, 1024, 64, 8, dtype)
        spec = kernel.apply(p, w, None)
        assert isinstance(spec.kernel, gemm_grouped.SignedCodes) != sub, dtype
        assert (dict(spec.template).get("GB") is not None) == sub, dtype
    seen = {}

    def fake(inputs, **kwargs):
        seen["codes"] = inputs[0]
        return ["y"]

    codes = mx.array(np.array([0, 1, 127, 128, 129, 255], np.uint8))  # a + 128
    assert gemm_grouped.SignedCodes(fake)(inputs=[codes, "xs"], grid=(1, 1, 1)) == ["y"]
    assert seen["codes"].dtype == mx.int8
    assert np.array(seen["codes"]).tolist() == [-128, -127, -1, 0, 1, 127]
    cuda_tma._tma_prototypes.cache_clear()
    launch._kernel.cache_clear()
