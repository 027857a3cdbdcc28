"""The CUDA candidates against the numpy float64 / int64 oracle, on the GPU.

Runs only where MLX has a CUDA device (the module is skipped elsewhere, with the reason
in the skip message: ``pytest -rs``). Every launch fills its outputs with a poison value
first (the ``poison`` fixture wraps ``mx.fast.cuda_kernel`` so each launch passes
``init_value=-128``, which no quantized code, scale or likely sum takes), so an element a
kernel never writes cannot pass by holding a previous run's right answer. Inputs are
fresh random draws each run (the seed is printed) plus fixed patterns.

Edge shapes and why:
- M = 1, 33, 129, 1000: one row; partial 16-row mma tiles and partial 64/128-row block
  tiles; many blocks with a tail.
- N = 257 (odd: the scalar store path), 264 (partial 128/256-column block tile).
- K = 48 (less than one 128-byte pipeline stage), 1088 (17 groups of 64: a stage holding
  a partial group run), 4096 (many stages: the cp.async ring wraps).
- Warp-specialized persistent GEMM (``gemm_ws.cu``): outputs with more tiles than the
  132-block grid (each block then runs several tiles and its ring and mbarrier phases
  carry over from one tile to the next), N = 258 (a row is not a whole number of 16-byte
  vectors: the scalar store path), N = 264 (a partial last tile stored as vectors).
- The TMA producer (``TMA_CONFIGS``) runs every warp-specialized test above on its tiles,
  and its outputs must equal the cp.async producer's bit for bit (same tile, same sums,
  same epilogue): the tile loads' zero fill past M, N and the K tail replaces the
  cp.async copies' predication.
- The group-wise TMA GEMM (``gemm_grouped_ws.cu``, written before any GPU ran it): K a
  multiple of 128 only (128: one k-tile; 1152: the ring wraps), every tile at every
  group size, all-zero weight and activation groups, the extreme codes of the
  promotion's integer-to-float step, and its sibling launches against each member's own.
"""

from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx

from mlx_w8a8.kernels import registry, tensormap
from mlx_w8a8.kernels.cuda import (
    dequant_matmul as cuda_dequant_matmul,
    gemm as cuda_gemm,
    gemm_dequant as cuda_gemm_dequant,
    gemm_grouped as cuda_gemm_grouped,
    gemm_ws as cuda_gemm_ws,
    gemv as cuda_gemv,
    launch,
    quantize as cuda_quantize,
    tiles as cuda_tiles,
    tma as cuda_tma,
)
from mlx_w8a8.kernels.registry import Problem
from mlx_w8a8.weight import QuantizedWeight

import oracle

if not launch.cuda_available():
    pytest.skip(
        "CUDA execution tests need MLX's CUDA backend with a GPU (mx.cuda.is_available() "
        "is False here); kernels are still compiled by tests/test_cuda_compile.py",
        allow_module_level=True,
    )

MX_DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
# Every warp-specialized tile: the cp.async producer's and the TMA producer's.
WS_TILES = {**cuda_tiles.WS_CONFIGS, **cuda_tiles.TMA_CONFIGS}


def ws_tile(name: str) -> cuda_tiles.WsConfig:
    """``WS_TILES[name]``; a TMA tile is skipped (reason shown) where the driver cannot
    encode tensor maps."""
    cfg = WS_TILES[name]
    if cfg.tma and not launch.is_sm90():
        pytest.skip("TMA needs a Hopper GPU (sm_90a)")
    if cfg.tma and tensormap.unavailable():
        pytest.skip(f"tensor maps cannot be encoded here: {tensormap.unavailable()}")
    return cfg


POISON = -128.0


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Every kernel built during the test fills its outputs with POISON before it runs."""
    real = mx.fast.cuda_kernel

    def poisoned(**build):
        kernel = real(**build)

        def run(**call):
            call.setdefault("init_value", POISON)
            return kernel(**call)

        return run

    monkeypatch.setattr(mx.fast, "cuda_kernel", poisoned)
    launch._kernel.cache_clear()
    yield
    launch._kernel.cache_clear()




def activation(rng, m, k, dtype, specials=True) -> mx.array:
    """Random normal rows with per-row spread; with ``specials``, rows that test the
    contract's corners: all zero, a NaN, an Inf, exact ties of rint (x = (j + 0.5) *
    scale), a row whose max is negative, values on and near rint's boundaries (the
    quantizer's fast path must hand them to its exact path: quantize.cuh RowQuantizer),
    and a row whose scale is below 2^-100 (no fast path)."""
    x = rng.standard_normal((m, k)).astype(np.float32) * rng.uniform(0.01, 10, (m, 1)).astype(np.float32)
    if specials and m >= 6:
        x[1] = 0.0
        x[2, k // 2] = np.nan
        x[3, 0] = np.inf
        # scale = 31.75 / 127 = 0.25 exactly, and every other x / scale is j + 0.5: rint ties.
        x[4] = (np.arange(k) % 9 - 4).astype(np.float32) * 0.25 + 0.125
        x[4, 0] = -127 / 4.0
        x[5] = -np.abs(x[5])
    if specials and m >= 8:
        x[6] = oracle.near_rounding_boundaries(rng, 1, k)[0]
        x[7] = x[7] * np.float32(1e-33)
    return mx.array(x).astype(MX_DTYPES[dtype])


def host(x: mx.array) -> np.ndarray:
    return oracle.to_numpy(x).astype(np.float32)


# quantize_activation ----------------------------------------------------------------------
# (8, 66304): the largest blocks the launcher makes (QUANT_MAX_THREADS), rows past the
# register cache (quantize.cu kCached), and the unsigned GEMM's K bound.
QUANT_SHAPES = [(1, 4096), (33, 1088), (129, 48), (1000, 4096), (7, 18944), (8, 66304)]
# Only valid problems: a group size must divide K.
QUANT_CASES = [(m, k, gs) for m, k in QUANT_SHAPES for gs in (None, 32, 64, 128)
               if gs is None or k % gs == 0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("m,k,group_size", QUANT_CASES)
def test_quantize_bit_exact(rng, dtype, m, k, group_size):
    x = activation(rng, m, k, dtype)
    q, scale, sums = cuda_quantize.quantize(x, group_size)
    want_q, want_s = oracle.quantize_rows(host(x))
    np.testing.assert_array_equal(np.array(q), want_q)
    got_s = np.array(scale)
    assert got_s.dtype == np.float32 and got_s.shape == (m, 1)
    np.testing.assert_array_equal(np.isnan(got_s), np.isnan(want_s))
    np.testing.assert_array_equal(got_s[~np.isnan(got_s)], want_s[~np.isnan(want_s)])
    if group_size is None:
        assert sums is None
    else:
        want_r = want_q.astype(np.int64).reshape(m, k // group_size, group_size).sum(-1)
        np.testing.assert_array_equal(np.array(sums), want_r)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("m,k", QUANT_SHAPES)
def test_quantize_row_sum_bit_exact(rng, dtype, m, k):
    """The ``rowsum`` body: same codes and scales as ``plain`` plus the int32 sum of each
    row's codes (0 for the zero / NaN / Inf rows)."""
    x = activation(rng, m, k, dtype)
    q, scale, rsum = cuda_quantize.quantize(x, row_sum=True)
    want_q, want_s = oracle.quantize_rows(host(x))
    np.testing.assert_array_equal(np.array(q), want_q)
    got_s = np.array(scale)
    np.testing.assert_array_equal(np.isnan(got_s), np.isnan(want_s))
    np.testing.assert_array_equal(got_s[~np.isnan(got_s)], want_s[~np.isnan(want_s)])
    got_r = np.array(rsum)
    assert got_r.dtype == np.int32 and got_r.shape == (m, 1)
    np.testing.assert_array_equal(got_r[:, 0], want_q.astype(np.int64).sum(-1))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("m,k", QUANT_SHAPES + [(9, 4104), (16, 8192)])
def test_quantize_row_sum_warp_bit_exact(rng, dtype, m, k):
    """The one-warp-per-row ``rowsum_warp`` body: the same bits as ``rowsum`` (codes,
    scales, row sums). M = 9: a partial last block (8 rows per block); K = 4104: 513
    chunks of 8, lanes with unequal shares; K = 8192 and 18944: rows longer than the
    register cache (re-read in the second pass)."""
    x = activation(rng, m, k, dtype)
    q, scale, rsum = cuda_quantize.quantize(x, row_sum=True, warp=True)
    want_q, want_s = oracle.quantize_rows(host(x))
    np.testing.assert_array_equal(np.array(q), want_q)
    got_s = np.array(scale)
    assert got_s.dtype == np.float32 and got_s.shape == (m, 1)
    np.testing.assert_array_equal(np.isnan(got_s), np.isnan(want_s))
    np.testing.assert_array_equal(got_s[~np.isnan(got_s)], want_s[~np.isnan(want_s)])
    got_r = np.array(rsum)
    assert got_r.dtype == np.int32 and got_r.shape == (m, 1)
    np.testing.assert_array_equal(got_r[:, 0], want_q.astype(np.int64).sum(-1))


@pytest.mark.parametrize("warp", [False, True])
@pytest.mark.parametrize("m,k", [(1, 4096), (33, 1088), (129, 48), (7, 18944), (1000, 4104)])
def test_rowsum_array_layout(rng, warp, m, k):
    """quantize_rowsum's one array, byte for byte (outputs poisoned before the launch):
    the codes, then the float32 scales, then the int32 row sums, then the map area up to
    rowsum_shape's R K (shape.cuh), all zero. K = 48 gives a map area of 256 + (-8 M mod
    48) bytes; K = 18944 and 4104 rows longer than one block's register cache. Where the
    TMA GEMM runs, it reads the array after numpy has (MLX may move the buffer then) and
    an allocation came between: its product equals the cp.async tile's bit for bit, and
    it wrote one 128-byte map into the map area and nothing else into the array (a map
    kept from before the read failed exactly here: docs/history.md)."""
    x = activation(rng, m, k, "bfloat16")
    xa = cuda_quantize.quantize_rowsum(x, warp)
    assert xa.dtype == mx.int8 and tuple(xa.shape) == cuda_quantize.rowsum_shape(m, k)
    raw = np.array(xa).reshape(-1)
    want_q, want_s = oracle.quantize_rows(host(x))
    np.testing.assert_array_equal(raw[: m * k].reshape(m, k), want_q)
    got_s = raw[m * k: m * k + 4 * m].view(np.float32)
    np.testing.assert_array_equal(np.isnan(got_s), np.isnan(want_s[:, 0]))
    np.testing.assert_array_equal(got_s[~np.isnan(got_s)], want_s[~np.isnan(want_s)])
    np.testing.assert_array_equal(raw[m * k + 4 * m: m * k + 8 * m].view(np.int32),
                                  want_q.astype(np.int64).sum(-1))
    area = raw[m * k + 8 * m:]
    assert cuda_quantize.ROWSUM_MAP_AREA <= area.size < cuda_quantize.ROWSUM_MAP_AREA + k
    assert (area == 0).all()
    if k % 32 or not launch.is_sm90() or tensormap.unavailable():
        return  # no per-channel weight of this K (group size 32 at the least), or no TMA
    weight = make_weight(rng, 200, k, 32, True, "bfloat16")
    mx.eval(weight.q, weight.channel_scales)  # allocated after the host read
    got = cuda_gemm.gemm_rowsum(xa, weight, None, mx.bfloat16, ws_tile("tma128"))
    want = cuda_gemm.gemm_rowsum(xa, weight, None, mx.bfloat16, cuda_tiles.WS_CONFIGS["ws128p4"])
    assert mx.array_equal(got, want, equal_nan=True).item()
    after = np.array(xa).reshape(-1)
    np.testing.assert_array_equal(after[: m * k + 8 * m], raw[: m * k + 8 * m])
    written = np.flatnonzero(after[m * k + 8 * m:])
    # one map: 128 bytes at the first 128-byte aligned byte of the area (shape.cuh rowsum_map)
    assert written.size and written[-1] < 127 + 128 and written[-1] - written[0] < 128, written


def quantize_body(x: mx.array, body: str):
    """``(q, scale, sums)`` of the quantize body ``body`` (``sums``: group size 64;
    ``plain``: no sums, ``None``)."""
    if body == "sums":
        return cuda_quantize.quantize(x, 64)
    return cuda_quantize.quantize(x, row_sum=body != "plain", warp=body == "rowsum_warp")


@pytest.mark.parametrize("body", ["plain", "rowsum", "rowsum_warp", "sums"])
def test_quantize_on_rounding_boundaries(rng, body):
    """Every quantize body on float32 rows built on and near rint's boundaries (ties,
    values a few ulps from one, and distances up to 2^-8; oracle.near_rounding_boundaries),
    scales from 2^-90 to 2^20: the codes are the IEEE division's, bit for bit, whichever
    path the kernel took (tests/test_quantize_rounding.py models that choice on the CPU)."""
    x = mx.array(oracle.near_rounding_boundaries(rng, 96, 4096))
    q, scale, _ = quantize_body(x, body)
    want_q, want_s = oracle.quantize_rows(host(x))
    np.testing.assert_array_equal(np.array(scale), want_s)
    np.testing.assert_array_equal(np.array(q), want_q)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("body", ["plain", "rowsum", "rowsum_warp", "sums"])
def test_quantize_every_16bit_value(dtype, body):
    """Every finite bfloat16 / float16 value under several row maxima (each row's max at
    column 0): every code boundary such rows meet, including the values a quarter of a
    bfloat16 warp's chunk steps send to RowQuantizer's exact path (x / s near a
    half-integer; |h| = 1/2, whose float gap toward 0 is half the other side's) and
    exact ties. Codes, scales and (where the body makes them) sums against the division."""
    from test_quantize_rounding import BF16_AMAXES, F16_AMAXES, every_value_under

    xf = every_value_under(dtype, BF16_AMAXES if dtype == "bfloat16" else F16_AMAXES)
    # Built from the bits: a GPU conversion may flush bfloat16's subnormals to zero.
    if dtype == "bfloat16":
        bits = (xf.view(np.uint32) >> 16).astype(np.uint16)
        assert ((bits.astype(np.uint32) << 16).view(np.float32) == xf).all()
    else:
        bits = xf.astype(np.float16).view(np.uint16)
        assert (bits.view(np.float16).astype(np.float32) == xf).all()
    x = mx.array(bits).view(MX_DTYPES[dtype])
    q, scale, sums = quantize_body(x, body)
    want_q, want_s = oracle.quantize_rows(xf)
    np.testing.assert_array_equal(np.array(scale), want_s)
    np.testing.assert_array_equal(np.array(q), want_q)
    if body == "sums":
        m, k = xf.shape
        want_r = want_q.astype(np.int64).reshape(m, k // 64, 64).sum(-1)
        np.testing.assert_array_equal(np.array(sums), want_r)
    elif body != "plain":
        np.testing.assert_array_equal(np.array(sums)[:, 0], want_q.astype(np.int64).sum(-1))


# int8_matmul ------------------------------------------------------------------------------
@pytest.mark.parametrize("m,n,k", [(1, 264, 4096), (33, 257, 48), (129, 264, 1088),
                                   (1000, 512, 1024), (2048, 640, 256)])
def test_int8_gemm_bit_exact(rng, m, n, k):
    a = oracle.random_int8(rng, (m, k))
    b = oracle.random_int8(rng, (n, k))
    c = cuda_gemm.int8_gemm(mx.array(a), mx.array(b))
    got = np.array(c)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.astype(np.int64), oracle.int8_matmul(a, b))


@pytest.mark.parametrize("config", sorted(cuda_tiles.GEMM_CONFIGS))
def test_int8_gemm_every_tile_config(rng, config):
    """Each tile shape the launchers may pick, forced, on a shape with tails in M, N, K;
    all -128 operands once too (the largest products, the only -128 * -128 = 2^14)."""
    cfg = cuda_tiles.GEMM_CONFIGS[config]
    m, n, k = 300, 392, 1040
    a = oracle.random_int8(rng, (m, k))
    b = oracle.random_int8(rng, (n, k))
    np.testing.assert_array_equal(
        np.array(cuda_gemm.int8_gemm(mx.array(a), mx.array(b), cfg)).astype(np.int64), oracle.int8_matmul(a, b))
    a[:] = -128
    b[:] = -128
    got = np.array(cuda_gemm.int8_gemm(mx.array(a), mx.array(b), cfg))
    assert np.all(got == k * 16384)


# The warp-specialized persistent GEMM: tails in M, N, K; K under one stage; one row; and
# outputs with more tiles than the 132-block grid (blocks run 2-3 tiles each, the ring and
# the mbarrier phases carry over between tiles at different ring positions: K = 256 is 2
# k-tiles per tile, 1088 is 9). The last: more k-tiles per tile (9) than most rings have
# stages and 4-5 tiles per block, so a ping-pong config's warpgroups alternate several
# times with each tile's first stages last filled for the other warpgroup's tile (one
# that waited on them before its partner had would pass the parity wait at once and
# multiply stale operands).
WS_GEMM_SHAPES = [(300, 392, 1040), (33, 257, 48), (1, 264, 4096), (2048, 2304, 256),
                  (1100, 2176, 1088), (4100, 2056, 1040)]


@pytest.mark.parametrize("config", sorted(WS_TILES))
@pytest.mark.parametrize("m,n,k", WS_GEMM_SHAPES)
def test_int8_gemm_ws_bit_exact(rng, config, m, n, k):
    cfg = ws_tile(config)
    a = oracle.random_int8(rng, (m, k))
    b = oracle.random_int8(rng, (n, k))
    got = np.array(cuda_gemm.int8_gemm(mx.array(a), mx.array(b), cfg))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.astype(np.int64), oracle.int8_matmul(a, b))
    if cuda_tiles.tiles(m, n, cfg) > launch.SMS:  # all -128: the largest products, persistently
        a[:] = -128
        b[:] = -128
        got = np.array(cuda_gemm.int8_gemm(mx.array(a), mx.array(b), cfg))
        assert np.all(got == k * 16384)


# Accumulator sets (WsConfig.accumulators): each count on both producers, K = 48 (one
# k-tile, its last k32 steps all zero fill: every set still written once), 1088 (9
# k-tiles), 4096; M = 16 and 77 (the TMA A box of M rows: the stage rows past M keep the
# previous k-tile's or tile's bytes and feed only unstored rows), 300 (three row tiles);
# N = 2304 at BN 32 gives 72 tiles per row tile, so blocks run several tiles and a set's
# first step of each tile must overwrite the previous tile's sums. All -128: the largest
# sums, split over the sets.
@pytest.mark.parametrize("tma", [False, True], ids=["cp_async", "tma"])
@pytest.mark.parametrize("bn,acc", [(32, 1), (32, 2), (32, 4), (64, 1), (64, 2)])
@pytest.mark.parametrize("m,n,k", [(16, 264, 48), (77, 392, 1088), (300, 2304, 4096)])
def test_int8_gemm_ws_accumulator_sets(rng, tma, bn, acc, m, n, k):
    name = next(name for name, c in WS_TILES.items() if c.bn == bn and c.tma == tma)
    cfg = ws_tile(name)._replace(accumulators=acc)  # a TMA tile skips off Hopper
    a = oracle.random_int8(rng, (m, k))
    b = oracle.random_int8(rng, (n, k))
    got = np.array(cuda_gemm.int8_gemm(mx.array(a), mx.array(b), cfg))
    np.testing.assert_array_equal(got.astype(np.int64), oracle.int8_matmul(a, b))
    a[:] = -128
    b[:] = -128
    got = np.array(cuda_gemm.int8_gemm(mx.array(a), mx.array(b), cfg))
    assert np.all(got == k * 16384)


@pytest.mark.parametrize("name", ["cuda_int8_gemm_ws", "cuda_int8_gemm_tma"])
def test_int8_gemm_ws_candidate(rng, name):
    """The registered warp-specialized int32 GEMMs (their own tile choice) on a shape with
    tails."""
    a = oracle.random_int8(rng, (777, 1040))
    b = oracle.random_int8(rng, (392, 1040))
    cand = registry.get("int8_matmul", name)
    if not cand.handles(Problem("int8_matmul", 777, 392, 1040, "int8", "int8")):
        pytest.skip(f"{name} is not offered here (tensormap: {tensormap.unavailable()})")
    got = np.array(cand.run(mx.array(a), mx.array(b)))
    np.testing.assert_array_equal(got.astype(np.int64), oracle.int8_matmul(a, b))


# linear -----------------------------------------------------------------------------------
def make_weight(rng, n, k, group_size, per_channel, scale_dtype) -> QuantizedWeight:
    w = rng.standard_normal((n, k)).astype(np.float32) * (1.0 / np.sqrt(k))
    if not per_channel:
        # Rows with a non-zero mean so the offsets b' = b + 128 s matter.
        w += rng.uniform(-0.05, 0.05, (n, 1)).astype(np.float32)
    return QuantizedWeight.from_float(
        mx.array(w).astype(MX_DTYPES[scale_dtype]), group_size=group_size, per_channel=per_channel)


def check_linear(rng, run, m, n, k, dtype, group_size, per_channel, with_bias, scale_dtype=None,
                 bits=8, oracle_of=None):
    """``run(x, weight, bias)`` against the oracle (``oracle.linear``; ``oracle.linear4``
    for ``bits=4``: MLX's 4-bit weights, group-wise; or ``oracle_of(x, weight, bias)``)
    on fresh random operands."""
    if bits == 4:
        weight = make_weight4(rng, n, k, group_size, scale_dtype or dtype)
    else:
        weight = make_weight(rng, n, k, group_size, per_channel, scale_dtype or dtype)
    assert weight.per_channel == per_channel
    x = activation(rng, m, k, dtype)
    bias = None
    if with_bias:
        bias = mx.array(rng.standard_normal(n).astype(np.float32) * 0.1).astype(MX_DTYPES[dtype])
    y = run(x, weight, bias)
    assert y.dtype == x.dtype and tuple(y.shape) == (m, n)
    want, bound = (oracle_of or (oracle.linear4 if bits == 4 else oracle.linear))(
        host(x), weight, None if bias is None else host(bias))
    oracle.assert_close(y, want, bound, dtype)


def sibling_members(rng, ns, k, dtype, with_bias, fmt, group_size):
    """One ``(weight, bias)`` pair per N in ``ns`` (weights ``[N, K]`` of format ``fmt``:
    ``per_channel``, ``grouped`` or ``grouped4``; biases in ``dtype`` where ``with_bias``)."""
    members = []
    for n in ns:
        bias = (mx.array(rng.standard_normal(n).astype(np.float32) * 0.1).astype(MX_DTYPES[dtype])
                if with_bias else None)
        members.append((make_weight4(rng, n, k, group_size, dtype) if fmt == "grouped4" else
                        make_weight(rng, n, k, group_size, fmt == "per_channel", dtype), bias))
    return members


LINEAR_SHAPES = [(1, 264, 4096), (33, 257, 1088), (129, 264, 128), (1000, 384, 1024)]


@pytest.mark.parametrize("name", ["cuda_w8a8_gemm", "cuda_w8a8_gemm_ws", "cuda_w8a8_gemm_tma"])
@pytest.mark.parametrize("m,n,k", LINEAR_SHAPES)
@pytest.mark.parametrize("dtype,with_bias", [("bfloat16", False), ("float16", True), ("float32", False)])
def test_w8a8_gemm_per_channel(rng, name, m, n, k, dtype, with_bias):
    if name == "cuda_w8a8_gemm_tma":
        ws_tile("tma256")  # skipped where TMA is not offered
    run = registry.get("linear", name).run
    check_linear(rng, run, m, n, k, dtype, 64, True, with_bias)


@pytest.mark.parametrize("unsigned", [True, False], ids=["u8", "flip"])
@pytest.mark.parametrize("config", ["wgmma", "large", "medium", "small"])
def test_w8a8_gemm_every_tile_config(rng, config, unsigned):
    """Both weight paths (unsigned codes + row-sum correction; codes flipped to int8)
    on every tile config."""
    if config not in cuda_tiles.GEMM_CONFIGS:
        pytest.skip(f"{config} turned off (MLX_W8A8_CUDA_WGMMA=0)")
    cfg = cuda_tiles.GEMM_CONFIGS[config]

    def run(x, weight, bias):
        xq, xs, xr = cuda_quantize.quantize(x, row_sum=unsigned)
        return cuda_gemm.gemm_per_channel(xq, xs, weight, bias, x.dtype, cfg, row_sums=xr)

    check_linear(rng, run, 300, 392, 1088, "bfloat16", 64, True, True)
    check_linear(rng, run, 129, 264, 4096, "float32", 64, True, False)


@pytest.mark.parametrize("config", sorted(WS_TILES))
@pytest.mark.parametrize("m,n,k,dtype,with_bias", [
    (300, 392, 1088, "bfloat16", True),  # tails in M and N, 9 k-tiles
    (129, 264, 4096, "float32", False),  # a partial last tile stored as 16-byte vectors
    (33, 258, 128, "float16", True),  # rows of 516 bytes: the scalar store path
    (1, 264, 1024, "bfloat16", False),  # one row
    (1100, 2176, 1024, "bfloat16", True),  # more tiles than blocks (persistent loop)
])
def test_w8a8_gemm_ws_every_tile_config(rng, config, m, n, k, dtype, with_bias):
    """The warp-specialized per-channel GEMM (unsigned codes + row-sum correction, the
    shared epilogue staged through shared memory) on each of its tiles."""
    cfg = ws_tile(config)

    def run(x, weight, bias):
        xq, xs, xr = cuda_quantize.quantize(x, row_sum=True, warp=True)
        return cuda_gemm.gemm_per_channel(xq, xs, weight, bias, x.dtype, cfg, row_sums=xr)

    check_linear(rng, run, m, n, k, dtype, 64, True, with_bias)


@pytest.mark.parametrize("config", ["wgmma", "large", "ws256p4", "tma256"])
@pytest.mark.parametrize("k", [launch.U8_MAX_K // 32 * 32, launch.U8_MAX_K // 32 * 32 + 32])
def test_w8a8_gemm_unsigned_k_bound(config, k):
    """Extreme operands at the exactness bound of the unsigned path: activation codes
    +-127 and weight codes 255 (int8 +127) everywhere, so |sum_k a_k q_k| = 127 * 255 * K,
    just below 2^31 at K = 66304; at K = 66336 the registered candidate must take the
    flipped path (the unsigned sum would pass 2^31). Float32 output against the oracle."""
    configs = {**cuda_tiles.GEMM_CONFIGS, **WS_TILES}
    if config not in configs:
        pytest.skip(f"{config} turned off (MLX_W8A8_CUDA_WGMMA=0)")
    cfg = ws_tile(config) if config in WS_TILES else configs[config]
    m, n = 130, 264
    x = np.ones((m, k), dtype=np.float32)
    x[1::2] = -1.0
    x[7, ::3] = 0.0
    w = np.full((n, k), 127, dtype=np.int8)
    w[5] = -127
    weight = QuantizedWeight.from_int8(mx.array(w), mx.ones((n,), dtype=mx.float32), 32)
    assert np.all(oracle.codes(weight)[0] == 255)
    xm = mx.array(x)
    want, bound = oracle.linear(x, weight, None)
    if k <= launch.U8_MAX_K:
        xq, xs, xr = cuda_quantize.quantize(xm, row_sum=True)
        y = cuda_gemm.gemm_per_channel(xq, xs, weight, None, mx.float32, cfg, row_sums=xr)
        oracle.assert_close(y, want, bound, "float32")
    else:
        with pytest.raises(ValueError):
            xq, xs, xr = cuda_quantize.quantize(xm, row_sum=True)
            cuda_gemm.gemm_per_channel(xq, xs, weight, None, mx.float32, cfg, row_sums=xr)
    y = registry.get("linear", "cuda_w8a8_gemm").run(xm, weight, None)
    oracle.assert_close(y, want, bound, "float32")


GROUPED_CASES = [(m, n, k, gs, st) for m, n, k in LINEAR_SHAPES
                 for gs, st in ((32, "float16"), (64, "bfloat16"), (128, "float32")) if k % gs == 0]


@pytest.mark.parametrize("m,n,k,group_size,scale_dtype", GROUPED_CASES)
def test_w8a8_gemm_grouped(rng, m, n, k, group_size, scale_dtype):
    run = registry.get("linear", "cuda_w8a8_gemm_grouped").run
    check_linear(rng, run, m, n, k, "bfloat16", group_size, False, m == 33, scale_dtype)


@pytest.mark.parametrize("config", ["grouped", "grouped_small"])
def test_w8a8_grouped_every_tile_config(rng, config):
    cfg = cuda_tiles.GEMM_CONFIGS[config]

    def run(x, weight, bias):
        xq, xs, xr = cuda_quantize.quantize(x, weight.group_size)
        return cuda_gemm_grouped.gemm_grouped(xq, xs, xr, weight, bias, x.dtype, cfg)

    check_linear(rng, run, 300, 392, 1088, "float16", 32, False, True, "bfloat16")


@pytest.mark.parametrize("m", [1, 2, 3, 8, 13, 16])
@pytest.mark.parametrize("per_channel,group_size", [(True, 64), (False, 32), (False, 128)])
def test_int8_gemv(rng, m, per_channel, group_size):
    """The registered candidate (fused: these M x K fit in shared memory)."""
    run = registry.get("linear", "cuda_int8_gemv").run
    assert cuda_gemv.gemv_fuses(m, 1024)
    check_linear(rng, run, m, 264, 1024, "bfloat16", group_size, per_channel, m % 2 == 1)
    check_linear(rng, run, m, 257, 128, "float16", group_size, per_channel, False)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("m,per_channel", [(1, True), (5, False), (16, True), (16, False)])
def test_int8_gemv_both_paths(rng, m, per_channel, fused):
    """Fused and two-launch paths forced, K = 1088 (not a multiple of the 32 x 16-byte
    sweep of a warp: a partial last sweep) and N = 8714 (more weight rows than the fused
    grid's 132 x 8 warps take in one pass, even at RW = 4: the persistent loop wraps;
    8714 % 4 = 2: a partial last row group)."""
    def run(x, weight, bias):
        return cuda_gemv.gemv(x, weight, bias, fused=fused)

    assert 8714 > cuda_gemv.GEMV_FUSED_BLOCKS * (cuda_gemv.GEMV_THREADS // 32) * 4
    check_linear(rng, run, m, 8714, 1088, "float32", 32 if not per_channel else 64,
                 per_channel, True)


def test_int8_gemv_large_k_two_launches(rng):
    """M = 16 with K = 8192 does not fit the fused kernel's shared memory: the launcher
    must take the two-launch path, and it must be right."""
    assert not cuda_gemv.gemv_fuses(16, 8192)
    run = registry.get("linear", "cuda_int8_gemv").run
    check_linear(rng, run, 16, 136, 8192, "bfloat16", 64, True, False)


@pytest.mark.parametrize("m", [1, 7, 8, 9, 16, 17, 31, 32])
@pytest.mark.parametrize("per_channel,group_size,scale_dtype",
                         [(True, 64, "bfloat16"), (False, 64, "bfloat16"),
                          (False, 128, "float16"), (False, 64, "float32")])
def test_int8_gemv_mma(rng, m, per_channel, group_size, scale_dtype):
    """The tensor-core small-M GEMV: every token-tile count (M = 1 ... 32, partial last
    tiles at 7, 9, 17, 31), N = 264 (a partial last 16-row block) and 20000, K = 1088
    (17 steps: warps with unequal step counts) and 4096 (GS 128: 32 groups of two
    steps), odd M with a bias."""
    run = registry.get("linear", "cuda_int8_gemv_mma").run
    check_linear(rng, run, m, 264, 1088 if group_size == 64 else 4096, "bfloat16", group_size,
                 per_channel, m % 2 == 1, scale_dtype)
    if m in (16, 31):
        check_linear(rng, run, m, 20000, 1024, "float16", group_size, per_channel, False,
                     scale_dtype)


@pytest.mark.parametrize("m", [1, 9, 16, 17, 32])
@pytest.mark.parametrize("group_size,scale_dtype", [(64, "bfloat16"), (128, "float16"),
                                                    (64, "float32")])
def test_w4a8_gemv_mma(rng, m, group_size, scale_dtype):
    """The tensor-core small-M GEMV on MLX's 4-bit weights as stored: token tiles 1-4,
    N = 264 (a partial last 16-row block), K = 1088 / 4096 (17 steps; 32 groups of 128),
    odd M with a bias, against the W4A8 oracle."""
    run = registry.get("linear", "cuda_w4a8_gemv_mma").run
    check_linear(rng, run, m, 264, 1088 if group_size == 64 else 4096, "bfloat16", group_size,
                 False, m % 2 == 1, scale_dtype, bits=4)


@pytest.mark.parametrize("m", [16, 31])
def test_w4a8_gemv_mma_extreme_codes(m):
    """Activation codes +-127 against extreme_weight4 (every nibble position, every code
    in order), group size 128, float32 output against the oracle: a wrong nibble order
    or a dropped group moves outputs far past the bound."""
    n, k = 264, 1024
    x = extreme_activation(m, k)
    weight = extreme_weight4(n, k, 128)
    want, bound = oracle.linear4(x, weight, None)
    got = registry.get("linear", "cuda_w4a8_gemv_mma").run(mx.array(x), weight, None)
    oracle.assert_close(got, want, bound, "float32")


@pytest.mark.parametrize("ns,lead,dtype,with_bias,fmt,group_size", [
    ((4096, 1024, 1024), (4, 4), "bfloat16", False, "grouped", 64),  # q/k/v, B = 16
    ((264, 40, 257), (31,), "float16", True, "grouped", 128),  # partial 16-row blocks
    ((1000, 1002), (2, 1), "float32", True, "per_channel", 64),  # M = 2
    ((4096, 1024, 1024), (16,), "bfloat16", False, "grouped4", 64),  # 4-bit q/k/v
    ((264, 40), (3, 7), "float16", True, "grouped4", 128),  # 4-bit, M = 21
])
def test_int8_gemv_mma_sibling_launch(rng, ns, lead, dtype, with_bias, fmt, group_size):
    """One tensor-core GEMV launch for 2-3 weights fed the same x (gemv_mma.cu *_group*,
    the 4-bit ones too):
    each output bit-identical (NaN where x's special rows give NaN) to the member's own
    launch and within the oracle's bound; a member's blocks never write another's output
    (poisoned outputs)."""
    k = 1024
    m = int(np.prod(lead))
    x = activation(rng, m, k, dtype).reshape(*lead, k)
    members = sibling_members(rng, ns, k, dtype, with_bias, fmt, group_size)
    acts = cuda_quantize.quantize_spec(m, k, x.dtype, lead=lead).launch(x)
    ys = cuda_gemv.gemv_mma_group_spec(m, members, x.dtype, lead).launch(*acts)
    for (weight, bias), y in zip(members, ys):
        assert y.shape == (*lead, weight.n) and y.dtype == x.dtype
        alone = cuda_gemv.gemv_mma_spec(m, weight, bias, x.dtype).launch(
            acts[0].reshape(m, k), acts[1].reshape(m, 1))[0]
        assert mx.array_equal(y.reshape(m, weight.n), alone, equal_nan=True).item()
        want, bound = (oracle.linear4 if fmt == "grouped4" else oracle.linear)(
            host(x.reshape(m, k)), weight, None if bias is None else host(bias))
        oracle.assert_close(y.reshape(m, weight.n), want, bound, dtype)


@pytest.mark.parametrize("m,rows", [(8, 4), (16, 2), (16, 4), (24, 2), (32, 2)])
@pytest.mark.parametrize("fmt,group_size,dtype,with_bias", [
    ("per_channel", 64, "bfloat16", True), ("grouped", 64, "bfloat16", False),
    ("grouped", 128, "float16", True), ("grouped4", 64, "bfloat16", True),
    ("grouped4", 128, "float32", False)])
def test_gemv_mma_row_tiles_equal_one_tile(rng, m, rows, fmt, group_size, dtype, with_bias):
    """Two or four tiles of 16 weight rows a block (gemv_mma.cu's RT): each output is the
    same sums in the same order as the one-tile launch's, so equal bit for bit (NaN where
    x's special rows give NaN), alone and in a sibling launch, and within the oracle's
    bound; N = 264 and 40 leave the last block partly past N (poisoned outputs)."""
    k = 1088 if group_size == 64 else 1024
    x = activation(rng, m, k, dtype)
    members = sibling_members(rng, (264, 40), k, dtype, with_bias, fmt, group_size)
    xq, xs = cuda_quantize.quantize_spec(m, k, x.dtype).launch(x)[:2]
    ys = cuda_gemv.gemv_mma_group_spec(m, members, x.dtype, rows=rows).launch(xq, xs)
    for (weight, bias), y_group in zip(members, ys):
        one = cuda_gemv.gemv_mma_spec(m, weight, bias, x.dtype).launch(xq, xs)[0]
        y = cuda_gemv.gemv_mma_spec(m, weight, bias, x.dtype, rows=rows).launch(xq, xs)[0]
        assert mx.array_equal(y, one, equal_nan=True).item()
        assert mx.array_equal(y_group, one, equal_nan=True).item()
        want, bound = (oracle.linear4 if fmt == "grouped4" else oracle.linear)(
            host(x), weight, None if bias is None else host(bias))
        oracle.assert_close(y, want, bound, dtype)


@pytest.mark.parametrize("m,n,warps", [(9, 264, 2), (32, 264, 4), (32, 264, 2),
                                       (32, 12672, None)])  # None: the rule (396 blocks: 2)
@pytest.mark.parametrize("fmt,group_size,dtype,with_bias", [
    ("grouped", 64, "bfloat16", False), ("grouped", 128, "float16", True),
    ("per_channel", 64, "bfloat16", True), ("grouped4", 64, "bfloat16", True)])
def test_gemv_mma_fewer_warps_within_the_bound(rng, m, n, warps, fmt, group_size, dtype,
                                               with_bias):
    """Two or four warps a block (gemv_mma.cu's W): K split among fewer warps, their
    partials added in another order; within the oracle's bound, N = 264 leaving the last
    block partly past N (poisoned outputs); at N = 12672, M = 32 the shipped rule's two
    warps (group-wise codes) or eight (per-channel codes)."""
    k = 1088 if group_size == 64 else 1024
    x = activation(rng, m, k, dtype)
    ((weight, bias),) = sibling_members(rng, (n,), k, dtype, with_bias, fmt, group_size)
    xq, xs = cuda_quantize.quantize_spec(m, k, x.dtype).launch(x)[:2]
    spec = cuda_gemv.gemv_mma_spec(m, weight, bias, x.dtype, warps=warps)
    if warps is None:
        assert dict(spec.template)["W"] == (8 if fmt == "per_channel" else 2)
    y = spec.launch(xq, xs)[0]
    want, bound = (oracle.linear4 if fmt == "grouped4" else oracle.linear)(
        host(x), weight, None if bias is None else host(bias))
    oracle.assert_close(y, want, bound, dtype)


@pytest.mark.parametrize("gs", [64, 128])
def test_int8_gemv_mma_extreme_codes(gs):
    """Activation codes +-127 and weight codes 255 and 0 (128 on every other code of one
    row) in every group: the int32 sums at their largest, the q ^ 0x80 flip at both ends;
    float32 output against the oracle."""
    m, n, k = 16, 264, 1024
    x = extreme_activation(m, k)
    weight = extreme_grouped_weight(n, k, gs)
    want, bound = oracle.linear(x, weight, None)
    y = registry.get("linear", "cuda_int8_gemv_mma").run(mx.array(x), weight, None)
    oracle.assert_close(y, want, bound, "float32")


# Two-stage split (registry.Candidate.stages) -------------------------------------------
@pytest.mark.parametrize("name,m,k,fmt", [
    ("cuda_w8a8_gemm", 129, 1024, "per_channel"), ("cuda_w8a8_gemm_ws", 129, 1024, "per_channel"),
    ("cuda_w8a8_gemm_grouped", 129, 1024, "grouped"),
    ("cuda_int8_gemv", 16, 8192, "per_channel"),  # 16 x 8192 does not fit the fused GEMV
    ("cuda_w4a8_gemv", 16, 8192, "grouped4"),  # ... two launches
    ("cuda_int8_gemv_mma", 16, 8192, "grouped"),
])
def test_stages_equal_run(rng, name, m, k, fmt):
    """apply(quantize(x)) gives the same bits as run(x)."""
    n = 264
    cand = registry.get("linear", name)
    problem = Problem("linear", m, n, k, "bfloat16", fmt, 64, True)
    key, quant, apply = cand.stages(problem)
    weight = (make_weight4(rng, n, k, 64, "bfloat16") if fmt == "grouped4" else
              make_weight(rng, n, k, 64, fmt == "per_channel", "bfloat16"))
    x = activation(rng, m, k, "bfloat16")
    bias = mx.array(rng.standard_normal(n).astype(np.float32)).astype(mx.bfloat16)
    y_run = np.array(cand.run(x, weight, bias).astype(mx.float32))
    y_stages = np.array(apply(quant(x), weight, bias, x.dtype).astype(mx.float32))
    np.testing.assert_array_equal(y_stages, y_run)


def test_rowsum_activations_are_interchangeable(rng):
    """cuda_w8a8_gemm and cuda_w8a8_gemm_ws name the same activation format, and either
    quantize body that writes it (``rowsum``, ``rowsum_warp``) gives the same bits, so
    either GEMM applied to either gives the same output."""
    problem = Problem("linear", 300, 392, 1088, "float16", "per_channel", 64, False)
    k1, q1, a1 = registry.get("linear", "cuda_w8a8_gemm").stages(problem)
    k2, q2, a2 = registry.get("linear", "cuda_w8a8_gemm_ws").stages(problem)
    assert k1 == k2
    x = activation(rng, 300, 1088, "float16")
    acts1, acts2 = q1(x), (cuda_quantize.quantize_rowsum(x, warp=True),)
    assert len(acts1) == 1  # every byte of the one array, the zero tail included
    np.testing.assert_array_equal(np.array(acts1[0]), np.array(acts2[0]))
    weight = make_weight(rng, 392, 1088, 64, True, "float16")
    for apply in (a1, a2):
        np.testing.assert_array_equal(np.array(apply(acts1, weight, None, x.dtype)),
                                      np.array(apply(acts2, weight, None, x.dtype)))


# The candidates as the tuner sees them ----------------------------------------------------
GATE_PROBLEMS = [
    Problem("quantize_activation", 129, 0, 1024, "bfloat16", "int8", 64),
    Problem("int8_matmul", 129, 264, 1024, "int8", "int8"),
    Problem("linear", 512, 512, 1024, "bfloat16", "per_channel", 64, True),
    Problem("linear", 512, 512, 1024, "bfloat16", "grouped", 64, False),
    Problem("linear", 1, 512, 1024, "bfloat16", "per_channel", 64, False),
    Problem("linear", 16, 512, 1024, "float16", "grouped", 128, True),
]


@pytest.mark.parametrize("problem", GATE_PROBLEMS, ids=lambda p: f"{p.op}-{p.m}-{p.weight_format}")
def test_gate_accepts_cuda_candidates(problem):
    from mlx_w8a8.tuning import gate

    found = [c for c in registry.candidates(problem) if c.backend == "cuda"]
    assert found, f"no CUDA candidate offered for {problem}"
    results = gate.run_gate(problem, registry.fallback(problem), found, gate.operands(problem))
    for cand in found:
        assert results[cand.name].passed, (cand.name, results[cand.name])


def test_capabilities():
    """Each candidate says no to what it cannot run (instead of failing at launch)."""
    gemv = registry.get("linear", "cuda_int8_gemv")
    assert gemv.handles(Problem("linear", 16, 64, 256, "bfloat16", "grouped", 64))
    assert not gemv.handles(Problem("linear", 17, 64, 256, "bfloat16", "grouped", 64))
    gemm = registry.get("linear", "cuda_w8a8_gemm")
    assert not gemm.handles(Problem("linear", 64, 64, 256, "bfloat16", "grouped", 64))
    assert registry.get("linear", "cuda_w8a8_gemm_grouped").handles(
        Problem("linear", 64, 64, 256, "bfloat16", "grouped", 64))
    assert not registry.get("int8_matmul", "cuda_int8_gemm").handles(
        Problem("int8_matmul", 4, 4, 40, "int8", "int8"))


# Sibling launches and [..., K] activations ---------------------------------------------------
@pytest.mark.parametrize("config", sorted(WS_TILES))
@pytest.mark.parametrize("ns,lead,dtype,with_bias", [
    ((392, 40, 264), (300,), "bfloat16", True),  # tails in N per member, 3 members
    ((2176, 1024), (2, 550), "bfloat16", False),  # more tiles than blocks, 3-D x
    ((258, 264), (33,), "float16", True),  # rows of 516 bytes: scalar stores in member 0
    ((264, 264, 264), (1, 1, 1), "float32", False),  # one row
])
def test_w8a8_gemm_ws_sibling_launch(rng, config, ns, lead, dtype, with_bias):
    """One launch for 2-3 weights fed the same activations (gemm_ws.cu group2/group3):
    each output is bit-identical (NaN where x's special rows give NaN) to that weight's own launch on the same tile, and within
    the oracle's bound; a member's tiles never write another member's output (poisoned
    outputs: an unwritten element fails)."""
    cfg = ws_tile(config)
    k = 1088
    m = int(np.prod(lead))
    x = activation(rng, m, k, dtype).reshape(*lead, k)
    members = sibling_members(rng, ns, k, dtype, with_bias, "per_channel", 64)
    acts = cuda_quantize.quantize_spec(m, k, x.dtype, None, True, lead=lead).launch(x)
    ys = cuda_gemm_ws.gemm_ws_group_spec(m, k, members, x.dtype, cfg, lead).launch(*acts)
    for (weight, bias), y in zip(members, ys):
        assert y.shape == (*lead, weight.n) and y.dtype == x.dtype
        alone = cuda_gemm.gemm_rowsum(acts[0], weight, bias, x.dtype, cfg)
        assert mx.array_equal(y.reshape(m, weight.n), alone, equal_nan=True).item()
        want, bound = oracle.linear(host(x.reshape(m, k)), weight,
                                    None if bias is None else host(bias))
        oracle.assert_close(y.reshape(m, weight.n), want, bound, dtype)


@pytest.mark.parametrize("ns,lead,dtype,with_bias,fmt,group_size", [
    ((4096, 1024, 1024), (1, 1), "bfloat16", False, "per_channel", 64),  # q/k/v, decode
    ((8714, 8714), (1,), "float32", True, "per_channel", 64),  # each member wraps the warps
    ((264, 40, 257), (2, 8), "float16", True, "grouped", 32),  # M = 16; N % RW != 0 (257)
    ((1000, 1002), (3,), "bfloat16", False, "grouped", 64),  # M = 3 (bucket 4), grouped
    ((4096, 1024, 1024), (1, 1), "bfloat16", False, "grouped4", 64),  # 4-bit q/k/v
    ((264, 40, 257), (2, 8), "float16", True, "grouped4", 32),  # 4-bit, M = 16
    ((8714, 8714), (3,), "bfloat16", True, "grouped4", 32),  # 4-bit gate/up, wraps
])
def test_int8_gemv_sibling_launch(rng, ns, lead, dtype, with_bias, fmt, group_size):
    """One fused GEMV launch for 2-3 weights fed the same x (gemv.cu fused_*_group*, the
    4-bit ones too): each output is bit-identical (NaN where x's special rows give NaN)
    to that weight's own fused launch and within the oracle's bound; every member's rows
    are written (an unwritten element of the uninitialised outputs fails the comparison)."""
    k = 1088
    m = int(np.prod(lead))
    assert cuda_gemv.gemv_fuses(m, k)
    x = activation(rng, m, k, dtype).reshape(*lead, k)
    members = sibling_members(rng, ns, k, dtype, with_bias, fmt, group_size)
    ys = cuda_gemv.gemv_fused_group_spec(m, k, members, x.dtype, lead).launch(x)
    x2 = x.reshape(m, k)
    for (weight, bias), y in zip(members, ys):
        assert y.shape == (*lead, weight.n) and y.dtype == x.dtype
        alone = cuda_gemv.gemv(x2, weight, bias, fused=True)
        assert mx.array_equal(y.reshape(m, weight.n), alone, equal_nan=True).item()
        want, bound = (oracle.linear4 if fmt == "grouped4" else oracle.linear)(
            host(x2), weight, None if bias is None else host(bias))
        oracle.assert_close(y.reshape(m, weight.n), want, bound, dtype)


@pytest.mark.parametrize("name", ["cuda_w8a8_gemm", "cuda_w8a8_gemm_ws", "cuda_w8a8_gemm_tma",
                                  "cuda_w8a8_gemm_grouped", "cuda_int8_gemv"])
@pytest.mark.parametrize("lead", [(2, 3), (1, 1), (3, 1, 5)])
def test_bound_launches_take_any_leading_shape(rng, name, lead):
    """The bound launches read x [..., K] as it is (the layer reshapes nothing) and
    return [..., N]: bit-identical to the same launches on x reshaped to [M, K]."""
    cand = registry.get("linear", name)
    m, n, k = int(np.prod(lead)), 264, 1024
    per_channel = name != "cuda_w8a8_gemm_grouped"
    weight = make_weight(rng, n, k, 64, per_channel, "bfloat16")
    problem = Problem("linear", m, n, k, "bfloat16", weight.format, 64, False)
    if not cand.supports(problem):
        pytest.skip(f"{name} does not take M = {m}")
    x = activation(rng, m, k, "bfloat16")
    _, quantize, apply = cand.bind_stages(problem, weight, None, lead)
    x3 = x.reshape(*lead, k)
    y = apply(x3) if quantize is None else apply(quantize(x3))
    _, quantize2, apply2 = cand.bind_stages(problem, weight, None)
    want = apply2(x) if quantize2 is None else apply2(quantize2(x))
    assert y.shape == (*lead, n)
    assert mx.array_equal(y.reshape(m, n), want, equal_nan=True).item()
    # A bound launch is made directly on its first call, traced on its second and
    # replayed after (launch.LaunchSpec.bound): the same bits on each.
    for _ in range(2):
        again = apply(x3) if quantize is None else apply(quantize(x3))
        assert mx.array_equal(again, y, equal_nan=True).item()


@pytest.mark.parametrize("kernel,lead", [("cuda_w8a8_gemm_ws", (2, 77)),
                                         ("cuda_w8a8_gemm_tma", (2, 77)),
                                         ("cuda_int8_gemv", (1, 1)), ("cuda_int8_gemv", (2, 5))])
def test_linear_siblings_run_as_one_launch_on_the_gpu(rng, kernel, lead):
    """q/k/v and gate/up of a converted block, one kernel chosen for every shape (the
    warp-specialized GEMMs at prefill, the fused GEMV at decode sizes): each member's
    output is bit-identical to its own launch."""
    import mlx.nn as nn

    import mlx_w8a8 as w8
    from mlx_w8a8 import siblings

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(1024, n, bias=False)
                                                     for n in (1024, 256, 256))
            self.gate_proj, self.up_proj = nn.Linear(1024, 2816), nn.Linear(1024, 2816)

    if kernel == "cuda_w8a8_gemm_tma":
        ws_tile("tma256")  # skipped where TMA is not offered
    block = Block()
    w8.quantize(block)
    ws = registry.get("linear", kernel)
    previous = registry.set_chooser(lambda problem, found: (ws, "test") if ws in found else None)
    try:
        siblings.clear()
        m = lead[0] * lead[1]
        x = activation(rng, m, 1024, "bfloat16").reshape(*lead, 1024)
        names = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
        outs = [block[name](x) for name in names]
        assert block.q_proj.decision(m)[1] == "test+siblings"
        for name, y in zip(names, outs):
            layer = block[name]
            layer.kernel = kernel  # forced: runs alone
            alone = layer(x)
            assert y.shape == alone.shape
            assert mx.array_equal(y, alone, equal_nan=True).item(), name
    finally:
        registry.set_chooser(previous)


@pytest.mark.parametrize("bn", [256, 128, 32])
def test_tma_activation_map_takes_each_launchs_rows(rng, bn):
    """A's tensor-map prototype is made once per K (cuda_tma._tma_prototypes) and each
    launch writes its own M and min(M, 128) box rows into it (tma.cuh tma_replace_rows):
    one weight, row counts below, at and across the 128-row tile, largest first, all on
    the same prototype array, each product equal to the int64 oracle. A launch that kept
    another launch's rows would read past its activations (wrong rows) or wait on bytes
    its box never brings (a hung barrier)."""
    tma = ws_tile(next(name for name, c in cuda_tiles.TMA_CONFIGS.items() if c.bn == bn))
    n, k = 200, 320
    b = oracle.random_int8(rng, (n, k))
    protos = set()
    for m in (300, 1, 77, 128, 129, 2):
        a = oracle.random_int8(rng, (m, k))
        got = cuda_gemm.int8_gemm(mx.array(a), mx.array(b), tma)
        np.testing.assert_array_equal(oracle.to_numpy(got), oracle.int8_matmul(a, b), err_msg=f"M={m}")
        protos.add(id(cuda_tma._tma_prototypes(k, (n,), tma.bn)))
    assert len(protos) == 1


@pytest.mark.parametrize("bn", [256, 128, 32])
def test_tma_linear_after_the_host_read_its_operands(rng, bn):
    """MLX moves an array's buffer when the host first reads it (newer CUDA backends
    copy a device buffer into unified memory and free the old one), so an address taken
    before the read is stale after it. The TMA GEMM makes its tensor maps in every
    launch from the addresses that launch receives (tma.cuh), so it reads the moved
    arrays: the activation array and the weight's codes read by numpy first, then
    arrays allocated (they may take the freed buffers), each product equal to the
    cp.async tile's bit for bit. A map kept across launches failed exactly here (the
    maps kept across launches failed that way: docs/history.md)."""
    tma = ws_tile(next(name for name, c in cuda_tiles.TMA_CONFIGS.items() if c.bn == bn))
    cp = cuda_tiles.WS_CONFIGS[f"ws{bn}p4"]
    for m, k in ((1, 4096), (33, 1088), (7, 18944)):
        xa = cuda_quantize.quantize_rowsum(activation(rng, m, k, "bfloat16"))
        weight = make_weight(rng, 200, k, 32, True, "bfloat16")
        np.array(xa), np.array(weight.q)
        fresh = make_weight(rng, 200, k, 32, True, "bfloat16")
        mx.eval(fresh.q, fresh.channel_scales)  # allocated now: may take the freed buffers
        got = cuda_gemm.gemm_rowsum(xa, weight, None, mx.bfloat16, tma)
        want = cuda_gemm.gemm_rowsum(xa, weight, None, mx.bfloat16, cp)
        assert mx.array_equal(got, want, equal_nan=True).item(), (m, k)


@pytest.mark.parametrize("bn", [256, 32])
def test_tma_launches_that_run_at_once_write_the_same_maps(rng, bn):
    """Every per-channel TMA launch writes its maps into arrays it shares: A's into the
    activation array's map area, each weight's into the weight's map array
    (cuda_tma.weight_maps), the same bytes from every launch on the same arrays
    (tma.cuh). Independent launches evaluated together (MLX may run them at once): two
    weights on each of four activation arrays (M across the 128-row tile: A's map
    differs between arrays, the weights' do not) and the two weights as one sibling
    launch; each product equal to the cp.async tile's bit for bit, each weight's map
    array the one kept with it."""
    tma = ws_tile(next(name for name, c in cuda_tiles.TMA_CONFIGS.items() if c.bn == bn))
    cp = cuda_tiles.WS_CONFIGS[f"ws{bn}p4"]
    k = 1088
    weights = [make_weight(rng, n, k, 32, True, "bfloat16") for n in (200, 392)]
    xas = [cuda_quantize.quantize_rowsum(activation(rng, m, k, "bfloat16")) for m in (300, 1, 77, 129)]
    mx.eval(xas)
    got = [cuda_gemm.gemm_rowsum(xa, w, None, mx.bfloat16, tma) for xa in xas for w in weights]
    group = [cuda_gemm_ws.gemm_ws_group_spec(cuda_quantize.rowsum_rows_m(*xa.shape), k,
                                       [(w, None) for w in weights], mx.bfloat16,
                                       tma).launch(xa) for xa in xas]
    mx.eval(got, group)
    want = [cuda_gemm.gemm_rowsum(xa, w, None, mx.bfloat16, cp) for xa in xas for w in weights]
    for i, (g, w) in enumerate(zip(got, want)):
        assert mx.array_equal(g, w, equal_nan=True).item(), i
    for i, ys in enumerate(group):
        for j, y in enumerate(ys):
            assert mx.array_equal(y, want[2 * i + j], equal_nan=True).item(), (i, j)
    for w in weights:
        assert cuda_tma.weight_maps(w, bn) is cuda_tma.weight_maps(w, bn)
        arr = np.array(cuda_tma.weight_maps(w, bn))
        assert arr.shape == (cuda_tma.WEIGHT_MAPS_BYTES,) and arr[256:].any()  # a map written


@pytest.mark.parametrize("bn", [256, 128, 64, 32])
@pytest.mark.parametrize("m,n,k", [(300, 392, 1088), (1, 264, 96), (2048, 2304, 4096),
                                   (129, 40, 4096)])
def test_tma_producer_matches_cp_async_bit_for_bit(rng, bn, m, n, k):
    """The two producers feed the same consumers: the int32 GEMM and the per-channel
    linear on the TMA tile equal the cp.async tile of the same width exactly (K = 96: a
    box mostly past K; N = 40 < BN: a box mostly past N; M = 1: past M). At BN = 128
    the TMA tile runs ping-pong consumers, the cp.async one cooperative ones."""
    tma = ws_tile(next(name for name, c in cuda_tiles.TMA_CONFIGS.items() if c.bn == bn))
    cp = cuda_tiles.WS_CONFIGS[f"ws{bn}p4"]
    a = mx.array(oracle.random_int8(rng, (m, k)))
    b = mx.array(oracle.random_int8(rng, (n, k)))
    assert mx.array_equal(cuda_gemm.int8_gemm(a, b, tma), cuda_gemm.int8_gemm(a, b, cp)).item()
    x = activation(rng, m, k, "bfloat16")
    weight = make_weight(rng, n, k, 32, True, "bfloat16")
    bias = mx.array(rng.standard_normal(n).astype(np.float32)).astype(mx.bfloat16)
    xq, xs, xr = cuda_quantize.quantize(x, row_sum=True)
    got = cuda_gemm.gemm_per_channel(xq, xs, weight, bias, x.dtype, tma, row_sums=xr)
    want = cuda_gemm.gemm_per_channel(xq, xs, weight, bias, x.dtype, cp, row_sums=xr)
    assert mx.array_equal(got, want, equal_nan=True).item()


# The group-wise TMA GEMM (gemm_grouped_ws.cu) ----------------------------------------------
# Written before any GPU ran it: compiled for sm_90a by tests/test_cuda_compile.py, which
# also checks its launch plans; these cases hold it to the oracle on an H200.
def grouped_tma_tile(name: str) -> cuda_tiles.GroupedTmaConfig:
    """``GROUPED_TMA_CONFIGS[name]``, skipped (reason shown) where the candidate cannot
    run: no Hopper GPU, or no driver to encode tensor maps."""
    if not launch.is_sm90():
        pytest.skip("the group-wise TMA GEMM needs a Hopper GPU (sm_90a)")
    if tensormap.unavailable():
        pytest.skip(f"tensor maps cannot be encoded here: {tensormap.unavailable()}")
    return cuda_tiles.GROUPED_TMA_CONFIGS[name]


def grouped_tma_run(cfg: cuda_tiles.GroupedTmaConfig | None = None):
    def run(x, weight, bias):
        xq, xs, xr = cuda_quantize.quantize_groups(x, weight.group_size)
        return cuda_gemm_grouped.gemm_grouped_tma(xq, xs, xr, weight, bias, x.dtype, cfg)
    return run


# K: 128 (one k-tile), 1152 (9 k-tiles: the ring of 5-9 stages wraps once), 4096 (32).
GROUPED_TMA_SHAPES = [(1, 264, 4096), (33, 257, 1152), (129, 264, 128), (1000, 384, 1024)]
GROUPED_TMA_CASES = [(m, n, k, gs, st, dt)
                     for i, (m, n, k) in enumerate(GROUPED_TMA_SHAPES)
                     for j, (gs, st) in enumerate(((32, "float16"), (64, "bfloat16"),
                                                   (128, "float32")))
                     for dt in (("bfloat16", "float16", "float32")[(i + j) % 3],)]


@pytest.mark.parametrize("m,n,k,group_size,scale_dtype,dtype", GROUPED_TMA_CASES)
def test_w8a8_gemm_grouped_tma(rng, m, n, k, group_size, scale_dtype, dtype):
    """The registered candidate (its own tile choice) against the float64 oracle: M = 1,
    odd M, N odd or not a multiple of any tile, every group size with scales stored in
    float16, bfloat16 and float32, every output dtype, bias on odd M; the activation's
    special rows (zero, NaN, Inf, ties, tiny scale) included (activation())."""
    grouped_tma_tile("gtma128")
    cand = registry.get("linear", "cuda_w8a8_gemm_grouped_tma")
    assert cand.supports(Problem("linear", m, n, k, dtype, "grouped", group_size, m % 2 == 1))
    check_linear(rng, cand.run, m, n, k, dtype, group_size, False, m % 2 == 1, scale_dtype)


@pytest.mark.parametrize("config", sorted(cuda_tiles.GROUPED_TMA_CONFIGS))
@pytest.mark.parametrize("group_size", cuda_tiles.GROUPED_TMA_GROUP_SIZES)
@pytest.mark.parametrize("m,n,k,dtype,with_bias", [
    (300, 392, 1152, "bfloat16", True),  # tails in M and N, 9 k-tiles
    (129, 264, 4096, "float32", False),  # a partial last tile stored as 16-byte vectors
    (33, 258, 128, "float16", True),  # rows of 516 bytes: the scalar store path; 1 k-tile
    (1, 264, 1024, "bfloat16", False),  # one row: A's box of 1 row
    (77, 40, 512, "float16", False),  # N < every tile: B's box mostly past N
    (1100, 2176, 1024, "bfloat16", True),  # more tiles than blocks (persistent loop)
])
def test_w8a8_grouped_tma_every_tile(rng, config, group_size, m, n, k, dtype, with_bias):
    """Each tile forced, at each group size (4, 2 or 1 groups per k-tile)."""
    cfg = grouped_tma_tile(config)
    check_linear(rng, grouped_tma_run(cfg), m, n, k, dtype, group_size, False, with_bias,
                 "bfloat16")


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group_size", cuda_tiles.GROUPED_TMA_GROUP_SIZES)
@pytest.mark.parametrize("m,n,k,with_bias", [
    (300, 392, 1152, True),  # tails in M and N, 9 k-tiles: the ring wraps
    (129, 264, 128, False),  # one k-tile: the block's only groups are those of one tile
    (1, 40, 256, False),  # one tile, one row: a single block whose barriers must balance
    (1100, 2176, 1024, True),  # more tiles than blocks: the order runs on across tiles
])
def test_grouped_tma_mma_order_is_the_same_arithmetic(rng, bits, group_size, m, n, k, with_bias):
    """Every tile with the consumers' MMA order (GroupedTmaConfig.order: named barriers
    1 and 2, each warpgroup promoting under the other's MMAs): exact against the oracle,
    and bit for bit the unordered tile's output. A barrier left unbalanced at a block's
    last group hangs or faults the launch; the persistent case's blocks take several
    tiles, so the order must hold across tiles."""
    grouped_tma_tile(sorted(cuda_tiles.GROUPED_TMA_CONFIGS)[0])  # skips where it cannot run
    configs = cuda_tiles.GROUPED4_TMA_CONFIGS if bits == 4 else cuda_tiles.GROUPED_TMA_CONFIGS
    for name, cfg in sorted(configs.items()):
        check_linear(rng, grouped_tma_run(cfg._replace(order=True)), m, n, k, "bfloat16",
                     group_size, False, with_bias, "bfloat16", bits=bits)
        weight = (make_weight4(rng, n, k, group_size, "bfloat16") if bits == 4
                  else make_weight(rng, n, k, group_size, False, "bfloat16"))
        x = activation(rng, m, k, "bfloat16")
        bias = mx.array(rng.standard_normal(n).astype(np.float32)).astype(mx.bfloat16) if with_bias else None
        plain = grouped_tma_run(cfg)(x, weight, bias)
        ordered = grouped_tma_run(cfg._replace(order=True))(x, weight, bias)
        assert mx.array_equal(plain, ordered, equal_nan=True).item(), name


def _grouped_tma_operands(rng, bits, m, n, k, group_size, with_bias):
    """The tiles of ``bits``-wide codes and fresh bfloat16 operands (weight, x, bias or
    None) for a group-wise TMA GEMM test; skips where the GEMM cannot run."""
    grouped_tma_tile(sorted(cuda_tiles.GROUPED_TMA_CONFIGS)[0])  # skips where it cannot run
    configs = cuda_tiles.GROUPED4_TMA_CONFIGS if bits == 4 else cuda_tiles.GROUPED_TMA_CONFIGS
    weight = (make_weight4(rng, n, k, group_size, "bfloat16") if bits == 4
              else make_weight(rng, n, k, group_size, False, "bfloat16"))
    x = activation(rng, m, k, "bfloat16")
    bias = mx.array(rng.standard_normal(n).astype(np.float32)).astype(mx.bfloat16) if with_bias else None
    return configs, weight, x, bias


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group_size", cuda_tiles.GROUPED_TMA_GROUP_SIZES)
@pytest.mark.parametrize("m,n,k,with_bias", [
    (1, 264, 1024, False),  # one row: seven of the eight consumer warps own no row
    (16, 392, 1152, True),  # warp 0's 16 rows exactly; 9 k-tiles: the ring wraps
    (17, 40, 256, False),  # one row into warp 1; one tile
    (64, 264, 128, True),  # warpgroup 1 owns no row; one k-tile
    (65, 264, 512, False),  # one row into warpgroup 1
    (200, 2176, 1024, True),  # a whole row tile, then one of 72 rows; more tiles than blocks
])
def test_grouped_tma_live_skips_only_rows_past_m(rng, bits, group_size, m, n, k, with_bias):
    """Every tile with the rows-past-M skip (GroupedTmaConfig.live), alone and with the
    MMA order: exact against the oracle and bit for bit the plain tile's output. A warp
    that skipped rows it owns leaves them unstored (the oracle check fails on them); one
    that left the stage release or the MMA order's barriers unbalanced hangs or faults
    the launch."""
    configs, weight, x, bias = _grouped_tma_operands(rng, bits, m, n, k, group_size, with_bias)
    for name, cfg in sorted(configs.items()):
        for live in (cfg._replace(live=True), cfg._replace(live=True, order=True)):
            check_linear(rng, grouped_tma_run(live), m, n, k, "bfloat16", group_size, False,
                         with_bias, "bfloat16", bits=bits)
            plain = grouped_tma_run(cfg)(x, weight, bias)
            assert mx.array_equal(plain, grouped_tma_run(live)(x, weight, bias),
                                  equal_nan=True).item(), (name, live)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group_size", cuda_tiles.GROUPED_TMA_GROUP_SIZES)
@pytest.mark.parametrize("m,n,k,with_bias", [
    (300, 392, 2560, True),  # tails in M and N; 20 k-tiles: the ring wraps, runs cross stages
    (129, 264, 256, False),  # two k-tiles: at group size 128 one run is the tile's groups
    (1, 40, 1024, False),  # one tile, one row: a single block
    (64, 264, 512, True),  # with the skip below: warpgroup 1 owns no row
    (1100, 2176, 1024, True),  # more tiles than blocks: runs restart on every tile
])
def test_grouped_tma_pipelined_promotion_is_the_same_arithmetic(rng, bits, group_size, m, n,
                                                                 k, with_bias):
    """Every tile with every pipelined-promotion run it takes (GroupedTmaConfig.pipe:
    two int32 sets, each group promoted under the next group's wgmmas) at this K and
    group size, alone and with the rows-past-M skip: exact against the oracle, and bit
    for bit the plain tile's output. A promotion that read a set before its wgmmas
    completed, a stage released while a wgmma still read it, or a run that lost a
    group's R differs from the plain tile; a stage never released hangs the launch."""
    configs, weight, x, bias = _grouped_tma_operands(rng, bits, m, n, k, group_size, with_bias)
    runs = 0
    for name, cfg in sorted(configs.items()):
        plain = grouped_tma_run(cfg)(x, weight, bias)
        for run in cuda_tiles.PIPE_RUNS[cfg.bn]:
            if (k // group_size) % run:
                continue
            for piped in (cfg._replace(pipe=run), cfg._replace(pipe=run, live=True)):
                runs += 1
                check_linear(rng, grouped_tma_run(piped), m, n, k, "bfloat16", group_size,
                             False, with_bias, "bfloat16", bits=bits)
                assert mx.array_equal(plain, grouped_tma_run(piped)(x, weight, bias),
                                      equal_nan=True).item(), (name, piped)
    assert runs > 0


@pytest.mark.parametrize("group_size", cuda_tiles.GROUPED_TMA_GROUP_SIZES)
def test_w8a8_grouped_tma_all_zero_groups(rng, group_size):
    """Groups whose weight codes are all zero, stored as mx.quantize stores them (scale
    -1e-7, the bias alone: an mlx-lm checkpoint's arrays, not re-quantized) and as
    quantize_weight does (scale 0), and activation groups that are all zero (R = 0, U =
    0): every tile, against the oracle."""
    m, n, k = 130, 264, 1024
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    w[::3, :group_size] = 0.0  # first group of every third row
    w[5, 2 * group_size:4 * group_size] = 0.0
    wq, scales, biases = mx.quantize(mx.array(w).astype(mx.bfloat16), group_size, 8)
    from_mlx = QuantizedWeight(wq, scales, biases, group_size, per_channel=False)
    ours = QuantizedWeight.from_float(mx.array(w).astype(mx.bfloat16), group_size,
                                      per_channel=False)
    x = np.array(host(activation(rng, m, k, "bfloat16")))
    x[:, group_size:2 * group_size] = 0.0
    x[9, :] = 0.0
    x = mx.array(x).astype(mx.bfloat16)
    for name in sorted(cuda_tiles.GROUPED_TMA_CONFIGS):
        run = grouped_tma_run(grouped_tma_tile(name))
        for weight in (from_mlx, ours):
            want, bound = oracle.linear(host(x), weight, None)
            oracle.assert_close(run(x, weight, None), want, bound, "bfloat16")


def extreme_grouped_weight(n: int, k: int, gs: int) -> QuantizedWeight:
    """Group-wise 8-bit codes 255 and 0 on alternate rows (row 5: 128 on every other
    code), float32 scales 0.5 ... 2 and biases -200 ... 3 over the groups."""
    codes = np.full((n, k), 255, dtype=np.uint8)
    codes[1::2] = 0
    codes[5, ::2] = 128
    scales = mx.array(np.linspace(0.5, 2.0, n * (k // gs)).reshape(n, k // gs).astype(np.float32))
    biases = mx.array(np.linspace(-200.0, 3.0, n * (k // gs)).reshape(n, k // gs).astype(np.float32))
    weight = QuantizedWeight(mx.array(codes.view(np.uint32)), scales, biases, gs,
                             per_channel=False)
    assert np.array_equal(oracle.codes(weight), codes)
    return weight


def extreme_activation(m: int, k: int) -> np.ndarray:
    """Rows of +-1 (every code +-127 after quantization), row 7 with every third value 0."""
    x = np.ones((m, k), dtype=np.float32)
    x[1::2] = -1.0
    x[7, ::3] = 0.0
    return x


@pytest.mark.parametrize("config", sorted(cuda_tiles.GROUPED_TMA_CONFIGS))
def test_w8a8_grouped_tma_extreme_codes(config):
    """Activation codes +-127 and weight codes 255 and 0 at group size 128: |U| reaches
    127 * 255 * 128 and |P| = |U - 128 R| 127 * 128 * 128 < 2^21, the range of the
    promotion's integer-to-float step (P + 0x4B400000 read as a float); float32 output
    against the oracle."""
    cfg = grouped_tma_tile(config)
    m, n, k, gs = 130, 264, 1024, 128
    x = extreme_activation(m, k)
    weight = extreme_grouped_weight(n, k, gs)
    want, bound = oracle.linear(x, weight, None)
    oracle.assert_close(grouped_tma_run(cfg)(mx.array(x), weight, None), want, bound, "float32")


def test_grouped_tma_sums_are_the_quantize_sums(rng):
    """quantize_groups is quantize's ``sums`` launch with room after the sums: the same
    codes, scales and sums bit for bit; after a GEMM has written A's map into the room,
    the sums are unchanged (the map lies past them) and a second GEMM on the same
    arrays (its map the same bytes) gives the same bits."""
    grouped_tma_tile("gtma32")
    m, k, gs = 77, 1024, 64
    x = activation(rng, m, k, "bfloat16")
    q0, s0, r0 = cuda_quantize.quantize(x, gs)
    q1, s1, r1 = cuda_quantize.quantize_groups(x, gs)
    assert tuple(r1.shape) == cuda_quantize.grouped_sums_shape(m, k, gs)
    np.testing.assert_array_equal(np.array(q1), np.array(q0))
    np.testing.assert_array_equal(np.array(s1), np.array(s0))
    np.testing.assert_array_equal(np.array(r1[: m * (k // gs)]).reshape(m, -1), np.array(r0))
    weight = make_weight(rng, 264, k, gs, False, "bfloat16")
    y1 = cuda_gemm_grouped.gemm_grouped_tma(q1, s1, r1, weight, None, mx.bfloat16)
    mx.eval(y1)
    np.testing.assert_array_equal(np.array(r1[: m * (k // gs)]).reshape(m, -1), np.array(r0))
    y2 = cuda_gemm_grouped.gemm_grouped_tma(q1, s1, r1, weight, None, mx.bfloat16)
    assert mx.array_equal(y1, y2, equal_nan=True).item()


def test_grouped_tma_after_the_host_read_its_operands(rng):
    """As test_tma_linear_after_the_host_read_its_operands: the group sums (A's map's
    home) and the weight's codes read by numpy first (MLX may move their buffers), then
    fresh arrays allocated; the maps each launch makes name the moved arrays, so the
    output still matches the oracle."""
    cfg = grouped_tma_tile("gtma64")
    for m, k, gs in ((1, 4096, 32), (33, 1152, 64), (7, 14336, 128)):
        x = activation(rng, m, k, "bfloat16")
        xq, xs, xr = cuda_quantize.quantize_groups(x, gs)
        weight = make_weight(rng, 200, k, gs, False, "bfloat16")
        np.array(xr), np.array(weight.q)
        fresh = make_weight(rng, 200, k, gs, False, "bfloat16")
        mx.eval(fresh.q, fresh.scales)  # allocated now: may take the freed buffers
        got = cuda_gemm_grouped.gemm_grouped_tma(xq, xs, xr, weight, None, mx.bfloat16, cfg)
        want, bound = oracle.linear(host(x), weight, None)
        oracle.assert_close(got, want, bound, "bfloat16")


@pytest.mark.parametrize("lead", [(2, 3), (1, 1), (3, 1, 5), (2, 77)])
def test_grouped_tma_bound_launches_take_any_leading_shape(rng, lead):
    """The bound form on x [..., K] equals the same launches on [M, K] bit for bit, on its
    first (direct), second (traced) and later (replayed) calls; and run(x) equals
    apply(quantize(x))."""
    grouped_tma_tile("gtma128")
    cand = registry.get("linear", "cuda_w8a8_gemm_grouped_tma")
    m, n, k = int(np.prod(lead)), 264, 1024
    weight = make_weight(rng, n, k, 64, False, "bfloat16")
    bias = mx.array(rng.standard_normal(n).astype(np.float32)).astype(mx.bfloat16)
    problem = Problem("linear", m, n, k, "bfloat16", "grouped", 64, True)
    x = activation(rng, m, k, "bfloat16")
    _, quantize, apply = cand.bind_stages(problem, weight, bias, lead)
    x3 = x.reshape(*lead, k)
    y = apply(quantize(x3))
    assert y.shape == (*lead, n)
    want = cand.run(x, weight, bias)
    assert mx.array_equal(y.reshape(m, n), want, equal_nan=True).item()
    key, quant, staged = cand.stages(problem)
    assert mx.array_equal(staged(quant(x), weight, bias, x.dtype), want, equal_nan=True).item()
    for _ in range(2):
        assert mx.array_equal(apply(quantize(x3)), y, equal_nan=True).item()


@pytest.mark.parametrize("bits,config", [(8, c) for c in sorted(cuda_tiles.GROUPED_TMA_CONFIGS)]
                         + [(4, c) for c in sorted(cuda_tiles.GROUPED4_TMA_CONFIGS)])
@pytest.mark.parametrize("ns,lead,dtype,with_bias,group_size", [
    ((392, 40, 264), (300,), "bfloat16", True, 64),  # tails in N per member, 3 members
    ((2176, 1024), (2, 550), "bfloat16", False, 128),  # more tiles than blocks, 3-D x
    ((258, 264), (33,), "float16", True, 32),  # rows of 516 bytes: scalar stores in member 0
    ((264, 264, 264), (1, 1, 1), "float32", False, 64),  # one row
])
def test_w8a8_grouped_tma_sibling_launch(rng, bits, config, ns, lead, dtype, with_bias,
                                         group_size):
    """One launch of the multi-weight bodies (tma_grouped_group2/3, tma_groupwise_group2/3
    for 4-bit weights) for weights fed the same x: each member's output equals its own
    launch on the same tile bit for bit, and the float64 oracle."""
    cfg = grouped4_tile(config) if bits == 4 else grouped_tma_tile(config)
    k = 1024
    m = int(np.prod(lead))
    weights = [make_weight4(rng, n, k, group_size, "bfloat16") if bits == 4
               else make_weight(rng, n, k, group_size, False, "bfloat16") for n in ns]
    biases = [mx.array(rng.standard_normal(n).astype(np.float32)).astype(MX_DTYPES[dtype])
              if with_bias else None for n in ns]
    x = activation(rng, m, k, dtype)
    xq, xs, xr = cuda_quantize.quantize_groups(x.reshape(*lead, k), group_size)
    outs = cuda_gemm_grouped.gemm_grouped_tma_group_spec(m, k, list(zip(weights, biases)), x.dtype, cfg,
                                              lead).launch(xq, xs, xr)
    assert len(outs) == len(ns)
    for y, w, b, n in zip(outs, weights, biases, ns):
        assert y.shape == (*lead, n)
        alone = cuda_gemm_grouped.gemm_grouped_tma_spec(m, k, w, b, x.dtype, cfg, lead).launch(xq, xs, xr)[0]
        assert mx.array_equal(y, alone, equal_nan=True).item(), n
        want, bound = (oracle.linear4 if bits == 4 else oracle.linear)(
            host(x), w, None if b is None else host(b))
        oracle.assert_close(y.reshape(m, n), want, bound, dtype)


# The subnormal promotion (cuda_w8a8_gemm_subnormal, cuda_w4a8_gemm_subnormal) -----------
# Held to its own bound (oracle.linear_subnormal: docs/numerics.md, the subnormal
# promotion); bfloat16 weights and activations (its offset pieces are bfloat16).
def sub_tile(name: str) -> cuda_tiles.GroupedTmaConfig:
    grouped_tma_tile("gtma128")  # skips where the TMA GEMMs are not offered
    return cuda_tiles.SUB_TMA_CONFIGS[name]


def sub_run(cfg: cuda_tiles.GroupedTmaConfig):
    def run(x, weight, bias):
        xq, xs, xr = cuda_quantize.quantize_groups(x, weight.group_size, u8=True)
        return cuda_gemm_grouped.gemm_grouped_tma(xq, xs, xr, weight, bias, x.dtype, cfg)
    return run


@pytest.mark.parametrize("name,bits", [("cuda_w8a8_gemm_subnormal", 8),
                                       ("cuda_w4a8_gemm_subnormal", 4)])
@pytest.mark.parametrize("m,n,k,group_size", [
    (1, 264, 4096, 64),  # one row; G = 64: ten whole offset blocks of 6 and one of 4 groups
    (17, 200, 512, 64),  # G = 8: a block of 6 groups and one of 2 (one k-tile)
    (33, 257, 1152, 32),  # N odd; blocks of 4 groups, 9 k-tiles: the ring wraps
    (129, 264, 128, 128),  # one k-tile, one group: a block of one group
    (1000, 384, 1024, 64),  # many row tiles
    (300, 392, 896, 128),  # G = 7: a block of 4 groups and one of 3
])
@pytest.mark.parametrize("scale_dtype", ["bfloat16", "float16"])
def test_subnormal_candidate(rng, name, bits, m, n, k, group_size, scale_dtype):
    """The registered candidate (its own tile) against the oracle within the form's
    bound, bias on odd M, the activation's special rows included; with float16 scales
    (bfloat16 activations) through its epilogue-form launch (gemm_grouped.SignedCodes)."""
    grouped_tma_tile("gtma128")
    cand = registry.get("linear", name)
    fmt = "grouped4" if bits == 4 else "grouped"
    assert cand.supports(Problem("linear", m, n, k, "bfloat16", fmt, group_size, m % 2 == 1))
    check_linear(rng, cand.run, m, n, k, "bfloat16", group_size, False, m % 2 == 1, scale_dtype,
                 bits=bits, oracle_of=oracle.linear_subnormal)


@pytest.mark.parametrize("config", sorted(cuda_tiles.SUB_TMA_CONFIGS))
@pytest.mark.parametrize("group_size", cuda_tiles.GROUPED_TMA_GROUP_SIZES)
@pytest.mark.parametrize("m,n,k,with_bias", [
    (300, 392, 1152, True),  # tails in M and N, 9 k-tiles
    (77, 40, 512, False),  # N < every tile
    (1100, 2176, 1024, True),  # more tiles than blocks (persistent loop)
])
def test_subnormal_every_tile(rng, config, group_size, m, n, k, with_bias):
    """Each tile forced, at each group size (blocks of 4 or 6 groups over 1-6 k-tiles)."""
    cfg = sub_tile(config)
    check_linear(rng, sub_run(cfg), m, n, k, "bfloat16", group_size, False, with_bias,
                 "bfloat16", bits=cfg.bits, oracle_of=oracle.linear_subnormal)


@pytest.mark.parametrize("config", sorted(cuda_tiles.SUB_TMA_CONFIGS))
@pytest.mark.parametrize("ns,lead,with_bias,group_size", [
    ((392, 40, 264), (300,), True, 64),
    ((2176, 1024), (2, 550), False, 128),
])
def test_subnormal_sibling_launch(rng, config, ns, lead, with_bias, group_size):
    """tma_subnormal_group2/3: each member's output equals its own launch bit for bit,
    and the oracle within the form's bound."""
    cfg = sub_tile(config)
    k = 1024
    m = int(np.prod(lead))
    weights = [make_weight4(rng, n, k, group_size, "bfloat16") if cfg.bits == 4
               else make_weight(rng, n, k, group_size, False, "bfloat16") for n in ns]
    biases = [mx.array(rng.standard_normal(n).astype(np.float32)).astype(mx.bfloat16)
              if with_bias else None for n in ns]
    x = activation(rng, m, k, "bfloat16")
    xq, xs, xr = cuda_quantize.quantize_groups(x.reshape(*lead, k), group_size, u8=True)
    outs = cuda_gemm_grouped.gemm_grouped_tma_group_spec(
        m, k, list(zip(weights, biases)), x.dtype, cfg, lead).launch(xq, xs, xr)
    for y, w, b, n in zip(outs, weights, biases, ns):
        alone = cuda_gemm_grouped.gemm_grouped_tma_spec(m, k, w, b, x.dtype, cfg, lead).launch(
            xq, xs, xr)[0]
        assert mx.array_equal(y, alone, equal_nan=True).item(), n
        want, bound = oracle.linear_subnormal(host(x), w, None if b is None else host(b))
        oracle.assert_close(y.reshape(m, n), want, bound, "bfloat16")


# The 4-bit form of the group-wise TMA GEMM (cuda_w4a8_gemm_tma) -----------------------------
# MLX's 4-bit weights as stored, the packed codes expanded on chip by the producer
# warpgroup; held to the W4A8 oracle (oracle.linear4) as the 8-bit form is to oracle.linear.
def grouped4_tile(name: str) -> cuda_tiles.GroupedTmaConfig:
    grouped_tma_tile("gtma128")  # skips where the TMA GEMMs are not offered
    return cuda_tiles.GROUPED4_TMA_CONFIGS[name]


def make_weight4(rng, n, k, group_size, scale_dtype) -> QuantizedWeight:
    """``mx.quantize(w, bits=4)``'s arrays: rows with a non-zero mean (the bias term
    matters), a row of zeros (MLX's all-zero groups: scale -1e-7, bias 0)."""
    w = rng.standard_normal((n, k)).astype(np.float32) * (1.0 / np.sqrt(k))
    w += rng.uniform(-0.05, 0.05, (n, 1)).astype(np.float32)
    w[n // 2] = 0.0
    return QuantizedWeight.from_float(mx.array(w).astype(MX_DTYPES[scale_dtype]),
                                      group_size=group_size, per_channel=False, bits=4)


@pytest.mark.parametrize("m,n,k,group_size,scale_dtype,dtype", GROUPED_TMA_CASES)
def test_w4a8_gemm_tma(rng, m, n, k, group_size, scale_dtype, dtype):
    """The registered candidate (its own tile) against the W4A8 oracle: M = 1, odd M, N
    not a multiple of any tile, every group size, scales in float16, bfloat16 and
    float32, every output dtype, bias on odd M, the activation's special rows."""
    grouped4_tile("g4tma128")
    cand = registry.get("linear", "cuda_w4a8_gemm_tma")
    assert cand.supports(Problem("linear", m, n, k, dtype, "grouped4", group_size, m % 2 == 1))
    check_linear(rng, cand.run, m, n, k, dtype, group_size, False, m % 2 == 1, scale_dtype, bits=4)


@pytest.mark.parametrize("config", sorted(cuda_tiles.GROUPED4_TMA_CONFIGS))
@pytest.mark.parametrize("group_size", cuda_tiles.GROUPED_TMA_GROUP_SIZES)
@pytest.mark.parametrize("m,n,k,dtype,with_bias", [
    (300, 392, 1152, "bfloat16", True),  # tails in M and N, 9 k-tiles (the ring wraps)
    (33, 258, 128, "float16", True),  # rows of 516 bytes: scalar stores; 1 k-tile
    (77, 40, 512, "float16", False),  # N < every tile: the packed box mostly past N
    (1100, 2176, 1024, "bfloat16", False),  # more tiles than blocks (persistent loop)
])
def test_w4a8_tma_every_tile(rng, config, group_size, m, n, k, dtype, with_bias):
    """Each 4-bit tile forced, at each group size."""
    cfg = grouped4_tile(config)
    check_linear(rng, grouped_tma_run(cfg), m, n, k, dtype, group_size, False, with_bias,
                 "bfloat16", bits=4)


def extreme_weight4(n: int, k: int, gs: int) -> QuantizedWeight:
    """4-bit codes 15 and 0 in every nibble position, one row holding every code in
    order (a wrong nibble order or a dropped half-byte changes the result), scales and
    biases spread over each group."""
    codes = np.full((n, k), 15, dtype=np.uint8)
    codes[1::2] = 0
    codes[5] = np.arange(k) % 16  # every code, in order: nibble order matters
    codes[9, ::2] = 3
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    scales = mx.array(np.linspace(0.5, 2.0, n * (k // gs)).reshape(n, k // gs).astype(np.float32))
    biases = mx.array(np.linspace(-20.0, 3.0, n * (k // gs)).reshape(n, k // gs).astype(np.float32))
    weight = QuantizedWeight(mx.array(packed.view(np.uint32)), scales, biases, gs,
                             per_channel=False, bits=4)
    assert np.array_equal(oracle.codes4(weight), codes)
    return weight


def test_w4a8_tma_extreme_codes():
    """Activation codes +-127 against extreme_weight4 at group size 128, float32 output
    against the oracle, every tile."""
    m, n, k, gs = 130, 264, 1024, 128
    x = extreme_activation(m, k)
    weight = extreme_weight4(n, k, gs)
    want, bound = oracle.linear4(x, weight, None)
    for name in sorted(cuda_tiles.GROUPED4_TMA_CONFIGS):
        got = grouped_tma_run(grouped4_tile(name))(mx.array(x), weight, None)
        oracle.assert_close(got, want, bound, "float32")


# The 4-bit GEMV (cuda_w4a8_gemv) ----------------------------------------------------------
# Written before any GPU ran it: compiled for sm_90a and its launches checked on the CPU by
# tests/test_cuda_compile.py; these cases hold it to the W4A8 oracle on a GPU.
@pytest.mark.parametrize("m", [1, 2, 3, 8, 13, 16])
@pytest.mark.parametrize("group_size,scale_dtype", [(32, "float16"), (64, "bfloat16"),
                                                    (128, "float32")])
def test_w4a8_gemv(rng, m, group_size, scale_dtype):
    """The registered candidate (fused: these M x K fit in shared memory) at every bucket,
    group size and scale dtype, bias on odd M; K = 128 is 4 chunks of 32 codes (most
    lanes idle)."""
    cand = registry.get("linear", "cuda_w4a8_gemv")
    assert cuda_gemv.gemv_fuses(m, 1024)
    assert cand.supports(Problem("linear", m, 264, 1024, "bfloat16", "grouped4", group_size,
                                 m % 2 == 1))
    check_linear(rng, cand.run, m, 264, 1024, "bfloat16", group_size, False, m % 2 == 1,
                 scale_dtype, bits=4)
    check_linear(rng, cand.run, m, 257, 128, "float16", group_size, False, False, scale_dtype,
                 bits=4)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("m", [1, 5, 16])
def test_w4a8_gemv_both_paths(rng, m, fused):
    """Fused and two-launch paths forced: K = 1088 (34 chunks of 32 codes: a partial
    sweep of a warp's lanes), N = 8714 (the persistent loop wraps; a partial last row
    group)."""
    def run(x, weight, bias):
        return cuda_gemv.gemv(x, weight, bias, fused=fused)

    check_linear(rng, run, m, 8714, 1088, "float32", 32, False, True, "bfloat16", bits=4)


def test_w4a8_gemv_large_k_two_launches(rng):
    """M = 16 with down_proj's K = 14336 does not fit the fused kernel: the candidate takes
    the two-launch path (its largest body, MM = 16)."""
    assert not cuda_gemv.gemv_fuses(16, 14336)
    run = registry.get("linear", "cuda_w4a8_gemv").run
    check_linear(rng, run, 16, 136, 14336, "bfloat16", 64, False, False, "bfloat16", bits=4)


@pytest.mark.parametrize("m,fused", [(9, True), (16, False)])
def test_w4a8_gemv_extreme_codes(m, fused):
    """Activation codes +-127 against extreme_weight4 (every nibble position, every code
    in order), group size 128, float32 output against the oracle."""
    n, k = 264, 1024
    x = extreme_activation(m, k)
    weight = extreme_weight4(n, k, 128)
    want, bound = oracle.linear4(x, weight, None)
    got = cuda_gemv.gemv(mx.array(x), weight, None, fused=fused)
    oracle.assert_close(got, want, bound, "float32")


# Activation groups on the group-wise TMA GEMM (cuda_act_groups_gemm_tma) -------------------
# Written before any GPU ran it: compiled for sm_90a and its launches checked on the CPU by
# tests/test_cuda_compile.py; these cases hold it to the oracle on a Hopper GPU.
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("m,k,group_size", [(1, 4096, 64), (33, 1152, 32), (7, 14336, 128),
                                            (129, 256, 64)])
def test_quantize_act_groups_bit_exact(rng, dtype, m, k, group_size):
    """The ``groups`` body against the oracle bit for bit: codes, one scale per row and
    group, the group code sums; the activation's special rows (zero, NaN, Inf, ties,
    tiny scale) included, and a zero group and a NaN inside one group of a normal row."""
    grouped_tma_tile("gtma32")
    x = np.array(host(activation(rng, m, k, dtype)))
    if m > 1:
        x[m - 1, :group_size] = 0.0
        x[m - 1, 3 * group_size + 1] = np.nan
    x = mx.array(x).astype(MX_DTYPES[dtype])
    q, scale, sums = cuda_quantize.quantize_act_groups(x, group_size)
    want_q, want_t = oracle.quantize_groups(host(x), group_size)
    np.testing.assert_array_equal(np.array(q), want_q)
    got_t = np.array(scale)
    assert got_t.shape == (m, k // group_size)
    np.testing.assert_array_equal(np.isnan(got_t), np.isnan(want_t))
    np.testing.assert_array_equal(got_t[~np.isnan(want_t)], want_t[~np.isnan(want_t)])
    want_r = want_q.astype(np.int64).reshape(m, -1, group_size).sum(-1)
    np.testing.assert_array_equal(np.array(sums[: m * (k // group_size)]).reshape(m, -1), want_r)


def _act_groups_run(cfg=None):
    def run(x, weight, bias):
        xq, xs, xr = cuda_quantize.quantize_act_groups(x, weight.group_size)
        return cuda_gemm_grouped.gemm_grouped_tma(xq, xs, xr, weight, bias, x.dtype, cfg,
                                                  act_groups=True)
    return run


def _check_act_groups(rng, run, m, n, k, dtype, group_size, with_bias, bits):
    weight = (make_weight4(rng, n, k, group_size, "bfloat16") if bits == 4
              else make_weight(rng, n, k, group_size, False, "bfloat16"))
    x = activation(rng, m, k, dtype)
    bias = (mx.array(rng.standard_normal(n).astype(np.float32) * 0.1).astype(MX_DTYPES[dtype])
            if with_bias else None)
    y = run(x, weight, bias)
    assert y.dtype == x.dtype and tuple(y.shape) == (m, n)
    want, bound = oracle.linear_act_groups(host(x), weight, None if bias is None else host(bias))
    oracle.assert_close(y, want, bound, dtype)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("m,n,k,group_size,dtype", [
    (33, 257, 1152, 32, "float16"), (1000, 384, 1024, 64, "bfloat16")])
def test_act_groups_pipelined_promotion(rng, bits, m, n, k, group_size, dtype):
    """Activation groups (t_mg loaded one group ahead as R is) with the pipelined
    promotion on every tile's longest run: against the activation-group oracle."""
    grouped_tma_tile("gtma128")
    configs = cuda_tiles.GROUPED4_TMA_CONFIGS if bits == 4 else cuda_tiles.GROUPED_TMA_CONFIGS
    for cfg in configs.values():
        run = cuda_tiles.pipe_run(cfg, k, group_size)
        assert run
        _check_act_groups(rng, _act_groups_run(cfg._replace(pipe=run)), m, n, k, dtype,
                          group_size, True, bits)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("m,n,k,group_size,dtype", [
    (1, 264, 4096, 64, "bfloat16"), (33, 257, 1152, 32, "float16"),
    (129, 264, 128, 128, "float32"), (1000, 384, 1024, 64, "bfloat16")])
def test_act_groups_gemm_tma(rng, bits, m, n, k, group_size, dtype):
    """The registered candidate (its own tile) on an act_scales="group" problem against
    the activation-group oracle, both code widths, bias on odd M."""
    grouped_tma_tile("gtma128")
    cand = registry.get("linear", "cuda_act_groups_gemm_tma")
    fmt = "grouped4" if bits == 4 else "grouped"
    assert cand.handles(Problem("linear", m, n, k, dtype, fmt, group_size, m % 2 == 1,
                                act_scales="group"))
    _check_act_groups(rng, cand.run, m, n, k, dtype, group_size, m % 2 == 1, bits)


@pytest.mark.parametrize("bits,config", [(8, c) for c in sorted(cuda_tiles.GROUPED_TMA_CONFIGS)]
                         + [(4, c) for c in sorted(cuda_tiles.GROUPED4_TMA_CONFIGS)])
@pytest.mark.parametrize("group_size", cuda_tiles.GROUPED_TMA_GROUP_SIZES)
def test_act_groups_tma_every_tile(rng, bits, config, group_size):
    """Each tile of each code width forced with activation groups: tails in M and N,
    9 k-tiles (the ring wraps), bias."""
    cfg = grouped4_tile(config) if bits == 4 else grouped_tma_tile(config)
    _check_act_groups(rng, _act_groups_run(cfg), 300, 392, 1152, "bfloat16", group_size,
                      True, bits)


@pytest.mark.parametrize("bits", [8, 4])
def test_act_groups_tma_sibling_launch(rng, bits):
    """The multi-weight bodies with activation groups: each member equals its own launch
    bit for bit, and the oracle."""
    cfg = grouped4_tile("g4tma128") if bits == 4 else grouped_tma_tile("gtma128")
    k, gs, lead = 1024, 64, (300,)
    m = 300
    ns = (392, 40, 264)
    weights = [make_weight4(rng, n, k, gs, "bfloat16") if bits == 4
               else make_weight(rng, n, k, gs, False, "bfloat16") for n in ns]
    x = activation(rng, m, k, "bfloat16")
    xq, xs, xr = cuda_quantize.quantize_act_groups(x, gs)
    outs = cuda_gemm_grouped.gemm_grouped_tma_group_spec(
        m, k, [(w, None) for w in weights], x.dtype, cfg, lead, act_groups=True).launch(xq, xs, xr)
    for y, w, n in zip(outs, weights, ns):
        alone = cuda_gemm_grouped.gemm_grouped_tma(xq, xs, xr, w, None, x.dtype, cfg,
                                                   act_groups=True)
        assert mx.array_equal(y, alone, equal_nan=True).item(), n
        want, bound = oracle.linear_act_groups(host(x), w, None)
        oracle.assert_close(y, want, bound, "bfloat16")


# The dequantizing GEMM (gemm_dequant.cu) --------------------------------------------------
def dequant_tile(name: str) -> cuda_tiles.DequantConfig:
    """``DEQUANT_CONFIGS[name]``; skipped (reason shown) off Hopper (wgmma)."""
    if not launch.is_sm90():
        pytest.skip("the dequantizing GEMM needs a Hopper GPU (sm_90a: wgmma)")
    return cuda_tiles.DEQUANT_CONFIGS[name]


def check_dequant(rng, run, m, n, k, dtype, group_size, bits, with_bias, scale_dtype=None):
    """``run(x, weight, bias)`` against ``oracle.linear_dequant`` (check_linear's operands,
    the activation's special rows included)."""
    check_linear(rng, run, m, n, k, dtype, group_size, False, with_bias, scale_dtype, bits,
                 oracle_of=lambda x, w, b: oracle.linear_dequant(x, w, b, dtype))


# Why each shape: tails in M and N with 18 k-tiles (the 8-stage ring wraps twice); one row
# (one token tile of 64 mostly past M); one k-tile; rows of 516 bytes (N = 258: the scalar
# store path) and a partial feature tile; more tiles than blocks (the persistent loop
# carries the ring's phases and the fragments' sets across tiles), an odd number of
# k-tiles (the loop's second set idle on the last).
DEQUANT_SHAPES = [(300, 392, 1152, True), (1, 264, 4096, False), (129, 264, 64, False),
                  (33, 258, 128, True), (1100, 2176, 960, True)]


@pytest.mark.parametrize("config", sorted(cuda_tiles.DEQUANT_CONFIGS))
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("shape", range(len(DEQUANT_SHAPES)))
def test_dequant_gemm_every_tile(rng, config, bits, group_size, shape):
    """Each tile forced, both code widths, every group size (2, 1 or half a group per
    k-tile), both 16-bit dtypes (alternating by case)."""
    m, n, k, with_bias = DEQUANT_SHAPES[shape]
    if k % group_size:
        pytest.skip(f"K = {k} holds no whole groups of {group_size}")
    cfg = dequant_tile(config)
    dtype = ("bfloat16", "float16")[(shape + bits // 4 + group_size // 32) % 2]
    check_dequant(rng, lambda x, w, b: cuda_gemm_dequant.gemm_dequant(x, w, b, cfg),
                  m, n, k, dtype, group_size, bits, with_bias)


@pytest.mark.parametrize("bits,fmt", [(8, "grouped"), (4, "grouped4")])
@pytest.mark.parametrize("scale_dtype,dtype", [("bfloat16", "bfloat16"), ("float16", "float16"),
                                               ("float32", "bfloat16"), ("bfloat16", "float16")])
def test_dequant_gemm_candidate(rng, bits, fmt, scale_dtype, dtype):
    """The registered candidate (its own tile) with scales stored in the activation's
    dtype and in another (rounded to it once, kept with the weight), leading shapes."""
    dequant_tile("dq128")
    cand = registry.get("linear", "cuda_dequant_gemm")
    assert not cand.w8a8
    assert cand.supports(Problem("linear", 300, 392, 1152, dtype, fmt, 64, True))
    check_dequant(rng, cand.run, 300, 392, 1152, dtype, 64, bits, True, scale_dtype)
    w = make_weight(rng, 264, 512, 64, False, scale_dtype) if bits == 8 else make_weight4(
        rng, 264, 512, 64, scale_dtype)
    x = activation(rng, 12, 512, dtype, specials=False).reshape(3, 4, 512)
    y = cuda_gemm_dequant.gemm_dequant(x, w)
    assert y.shape == (3, 4, 264)
    want, bound = oracle.linear_dequant(host(x).reshape(12, 512), w, None, dtype)
    oracle.assert_close(y.reshape(12, 264), want, bound, dtype)


# cuda_dequant_matmul: the dequantize launch, then mx.matmul ------------------------------
# Why each size: a thread's 16 codes a quarter of the smallest group (N = 1, K = 32: two
# threads, one block mostly idle); rows of 72 chunks, so blocks end mid-row and the last
# block is partial (264 x 1152); a weight whose words are not a multiple of the block.
DEQUANTIZE_SHAPES = [(1, 32), (264, 1152), (70, 384)]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dequantize_writes_each_weight_rounded_once(rng, bits, group_size, dtype):
    """The first step's weight equals the oracle's bit for bit: every code of every
    group in place, T(s q + b) rounded once (scales stored in the activation's dtype)."""
    for n, k in DEQUANTIZE_SHAPES:
        if k % group_size:
            continue
        w = (make_weight(rng, n, k, group_size, False, dtype) if bits == 8
             else make_weight4(rng, n, k, group_size, dtype))
        got = host(cuda_dequant_matmul.dequantize(w, getattr(mx, dtype))).astype(np.float64)
        want = oracle.dequantized(w, dtype)
        assert got.shape == (n, k)
        assert np.array_equal(got, want), (n, k, int((got != want).sum()))


# MLX's float GEMM (cuBLAS) is not held to float32 accumulation: on an NVIDIA H100 its
# bfloat16 / float16 products on DEQUANT_SHAPES were off the float64 product of the same
# operands by up to 7 units in the output's last place, past oracle.linear_dequant's bound
# (part DQY of bench/results/h100_2026-12-05_f.log). So the candidate is held to MLX's own
# matmul on the oracle's weight, bit for bit, and to the float64 product within one
# rounding of the output dtype relative to sum |x w| (as if partial sums were rounded to T;
# the cause was not examined).
GEMM_PRECISION = {"bfloat16": 2.0**-8, "float16": 2.0**-11}


@pytest.mark.parametrize("bits,fmt", [(8, "grouped"), (4, "grouped4")])
@pytest.mark.parametrize("scale_dtype,dtype", [("bfloat16", "bfloat16"), ("float16", "float16"),
                                               ("float32", "bfloat16")])
def test_dequant_matmul_candidate(rng, bits, fmt, scale_dtype, dtype):
    """The registered candidate on the dequantizing GEMM's shapes (tails, one row, a
    weight row of one group: K = 64 at group size 64), scales in the activation's dtype
    and in another: mx.matmul on the exact weight, bit for bit; bound with a leading
    shape, it returns what run returns."""
    cand = registry.get("linear", "cuda_dequant_matmul")
    assert not cand.w8a8
    t = getattr(mx, dtype)
    for m, n, k, with_bias in DEQUANT_SHAPES:
        assert cand.supports(Problem("linear", m, n, k, dtype, fmt, 64, with_bias))
        w = make_weight(rng, n, k, 64, False, scale_dtype) if bits == 8 else make_weight4(
            rng, n, k, 64, scale_dtype)
        x = activation(rng, m, k, dtype)
        bias = (mx.array(rng.standard_normal(n).astype(np.float32) * 0.1).astype(t)
                if with_bias else None)
        y = cand.run(x, w, bias)
        exact_w = mx.array(oracle.dequantized(w, dtype).astype(np.float32)).astype(t)
        same = cuda_dequant_matmul.product(x, exact_w, bias)
        assert mx.array_equal(y, same, equal_nan=True).item(), (m, n, k)
        want, bound = oracle.linear_dequant(host(x), w, None if bias is None else host(bias), dtype)
        magnitude = np.abs(host(x).astype(np.float64)) @ np.abs(oracle.dequantized(w, dtype)).T
        oracle.assert_close(y, want, bound + GEMM_PRECISION[dtype] * magnitude, dtype)
    w = make_weight(rng, 264, 512, 64, False, scale_dtype) if bits == 8 else make_weight4(
        rng, 264, 512, 64, scale_dtype)
    x = activation(rng, 12, 512, dtype, specials=False).reshape(3, 4, 512)
    p = Problem("linear", 12, 264, 512, dtype, fmt, 64, False)
    key, quantize, apply = cand.bind_stages(p, w, None, (3, 4))
    assert key is None and quantize is None
    y = apply(x)
    assert y.shape == (3, 4, 264)
    assert mx.array_equal(y.reshape(12, 264), cand.run(x.reshape(12, 512), w, None)).item()
