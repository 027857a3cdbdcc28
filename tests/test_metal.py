"""Every Metal kernel, executed in the Metal-emulation harness, against the numpy oracle.

No Apple GPU is needed: ``tests/metal_emu`` compiles the exact source MLX would hand to
the Metal compiler as C++ and runs the dispatch on the CPU (threads as fibers, real
barriers, SIMD-group collectives). The candidates' own launch code runs unchanged; only
the final "call the kernel" step is swapped for the emulator. These tests never skip:
without clang they fail, saying so.

Shapes are small (the emulator runs every GPU thread) but cover M = 1, 33, 64 and tails
in N and K; int32 results must be bit-exact, float results within float32 rounding
(docs/numerics.md). Outputs are poisoned by the harness before every run.
"""

from __future__ import annotations

import contextlib

import mlx.core as mx
import numpy as np
import pytest

import oracle
from metal_emu import harness
from mlx_w8a8 import ops
from mlx_w8a8.kernels import metal, registry
from mlx_w8a8.kernels.registry import Problem
from mlx_w8a8.weight import QuantizedWeight

DTYPES = ("float32", "float16", "bfloat16")


class Backend:
    """Where a test's kernels run: ``"emulator"`` (every machine with clang) or
    ``"gpu"`` (an Apple GPU through MLX; skipped where there is no Metal)."""

    def __init__(self, kind, sources):
        self.kind, self.sources = kind, sources

    def ran(self, body: str) -> bool:
        """Whether the kernel body ``body`` ran (always True on a GPU: not observable)."""
        if self.sources is None:
            return True
        return any(name.startswith(f"custom_kernel_w8a8_{body}") for name in self.sources)

    def need_nax(self, nax: bool = True):
        if nax and self.kind == "gpu" and not metal.nax_available():
            pytest.skip("needs a GPU with neural accelerators (M5 class, macOS 26.2+)")


# On a Mac every kernel test runs twice: emulated and on the GPU. Elsewhere the GPU
# variant does not exist (rather than being skipped): the emulator runs everything.
BACKENDS = ["emulator"] + (["gpu"] if mx.metal.is_available() else [])


@pytest.fixture(params=BACKENDS)
def emulated(request):
    """Emulator: Metal present without NAX unless a test says otherwise, kernels run by
    the harness. GPU: real capabilities, kernels run by MLX on the Apple GPU."""
    if request.param == "gpu":
        yield Backend("gpu", None)
        return
    previous = metal.set_executor(harness.executor)
    harness.executor.sources.clear()
    try:
        with metal.override(metal=True, nax=False):
            yield Backend("emulator", harness.executor.sources)
    finally:
        metal.set_executor(previous)


def activation(rng, m, k, dtype, edge_rows=True):
    """Random activations with a wide dynamic range; with ``edge_rows`` some rows are
    all zero (scale 0 path), hold NaN / +Inf (scale NaN path) or tie at .5 (rounding)."""
    x = (rng.standard_normal((m, k)) * np.exp(rng.uniform(-3, 3, (m, 1)))).astype(np.float32)
    if edge_rows and m >= 4:
        x[1] = 0.0
        x[2, k // 2] = np.nan
        x[3, 0] = np.inf
    if edge_rows and m >= 6 and k >= 3:
        # amax 127 gives scale exactly 1, so x / scale = x and k + 0.5 ties must go to even.
        x[5] = rng.integers(-126, 126, k) + 0.5
        x[5, 0] = 127.0
    xm = mx.array(x).astype(getattr(mx, dtype))
    return xm, oracle.to_numpy(xm).astype(np.float32)


def weight(rng, n, k, per_channel, group_size=32):
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32))
    return QuantizedWeight.from_float(w, group_size=group_size, per_channel=per_channel)


# ---------------------------------------------------------------------------------------
# quantize_activation
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,group_size", [
    (1, 1, None),      # the smallest row: one element, fewer than a SIMD-group of lanes
    (33, 200, None),   # K not a multiple of 32 or of the 256-element chunk
    (64, 96, 32),      # several groups per SIMD-group (3 groups, 8 SIMD-groups)
    (33, 640, 64),     # more groups (10) than SIMD-groups (8): a SIMD-group takes two
    (7, 128, 128),     # one group per row
])
def test_quantize_matches_oracle(emulated, rng, dtype, m, k, group_size):
    x, xv = activation(rng, m, k, dtype)
    q, scale, rs = metal.quantize(x, group_size)
    want_q, want_scale = oracle.quantize_rows(xv)
    assert emulated.ran("quantize")
    assert q.dtype == mx.int8 and scale.dtype == mx.float32
    np.testing.assert_array_equal(np.array(q), want_q)  # bit-exact codes
    np.testing.assert_array_equal(np.array(scale), want_scale)  # NaN where the row is bad
    assert np.array(q).min() >= -127  # -128 is never produced
    if group_size is None:
        assert rs is None
    else:
        want_rs = want_q.astype(np.int64).reshape(m, k // group_size, group_size).sum(-1)
        np.testing.assert_array_equal(np.array(rs), want_rs)


def test_quantize_denormal_rows(emulated, rng):
    """Rows whose max |x| is a float32 denormal: IEEE arithmetic keeps them (scale
    amax / 127, codes up to 127); a GPU that flushes denormals to zero would give
    zero scales and codes. The emulator is IEEE; on a Mac this is a hardware check."""
    x = (rng.standard_normal((3, 64)) * 1e-39).astype(np.float32)
    x[2] = rng.standard_normal(64).astype(np.float32)  # a normal row beside them
    assert np.all(np.abs(x[:2]).max(axis=1) < np.finfo(np.float32).tiny)  # denormal amax
    q, scale, _ = metal.quantize(mx.array(x))
    want_q, want_scale = oracle.quantize_rows(x)
    np.testing.assert_array_equal(np.array(scale), want_scale)
    np.testing.assert_array_equal(np.array(q), want_q)
    assert np.abs(want_q[:2]).max() == 127


# ---------------------------------------------------------------------------------------
# int8_matmul (raw int32), both kernels
# ---------------------------------------------------------------------------------------
INT8_SHAPES = [
    (1, 1, 1),       # one output, one product: every tile is almost all tail
    (1, 70, 150),    # decode row; N and K tails (70 = 64 + 6, 150 = 9 * 16 + 6)
    (33, 33, 40),    # M, N one past a 32 tile; K one and a quarter 32-tiles
    (64, 64, 64),    # exact NAX tile, two simd tiles each way
    (64, 40, 17),    # K one past a 16 step
]


@pytest.mark.parametrize("name,run", [("nax_gemm", metal.nax_int8_matmul), ("simd_gemm", metal.simd_int8_matmul)])
@pytest.mark.parametrize("m,n,k", INT8_SHAPES)
def test_int8_matmul_bit_exact(emulated, rng, name, run, m, n, k):
    emulated.need_nax(name == "nax_gemm")
    a = oracle.random_int8(rng, (m, k))  # full range, -128 included
    b = oracle.random_int8(rng, (n, k))
    c = run(mx.array(a), mx.array(b))
    assert emulated.ran(name)
    assert c.dtype == mx.int32 and c.shape == (m, n)
    np.testing.assert_array_equal(np.array(c), oracle.int8_matmul(a, b))


@pytest.mark.parametrize("tile", sorted(metal.NAX_TILES))
def test_nax_tiles_bit_exact(emulated, rng, tile):
    """Every registered NAX tile on one shape with tails everywhere: M = 70 gives 3 M
    tiles of 32 (swizzle 1: one threadgroup of the grid is past the last tile) or 2 of
    64; N = 140 leaves a partial SIMD-group block; K = 100 runs 3 unguarded 32-steps and
    a guarded 4-wide tail."""
    emulated.need_nax()
    a, b = oracle.random_int8(rng, (70, 100)), oracle.random_int8(rng, (140, 100))
    c = metal.nax_int8_matmul(mx.array(a), mx.array(b), tile=tile)
    assert emulated.ran("nax_gemm")
    np.testing.assert_array_equal(np.array(c), oracle.int8_matmul(a, b))
    cand = registry.get("int8_matmul", f"metal_nax_int8_gemm_{tile}")
    with metal.override(metal=True, nax=True):
        np.testing.assert_array_equal(np.array(cand.run(mx.array(a), mx.array(b))), oracle.int8_matmul(a, b))


@pytest.mark.parametrize("m,n,k,tile", [
    (300, 40, 40, "32x128"),   # 10 M tiles, swizzle 2: the grid's 12th M slot is empty
    (450, 70, 36, "64x64"),    # 8 M tiles, swizzle 2: every slot used; N and K tails
])
def test_nax_swizzle_covers_every_tile(emulated, rng, m, n, k, tile):
    """With 2^2 threadgroups walking down M, every output tile is computed exactly once
    (the poisoned output shows any tile left out) and threadgroups past the last M tile
    write nothing (guard bytes)."""
    emulated.need_nax()
    assert metal.nax_swizzle(-(-m // metal.NAX_TILES[tile][0])) == 2
    a, b = oracle.random_int8(rng, (m, k)), oracle.random_int8(rng, (n, k))
    c = metal.nax_int8_matmul(mx.array(a), mx.array(b), tile=tile)
    np.testing.assert_array_equal(np.array(c), oracle.int8_matmul(a, b))


@pytest.mark.parametrize("name,run", [("nax_gemm", metal.nax_int8_matmul), ("simd_gemm", metal.simd_int8_matmul)])
def test_int8_matmul_exact_past_2_24(emulated, name, run):
    """127 x 127 products (odd, 16129) with every 8th weight 126: each output is about
    2100 * 16129 > 2^24, so a float accumulator that were never flushed to int32 would
    round (the simd kernel flushes every 1024 values of K; the emulated float MMA adds
    in float32, no more precisely than the GPU). K = 2100 also spans 9 NAX K blocks."""
    emulated.need_nax(name == "nax_gemm")
    m, n, k = 2, 3, 2100
    a = np.full((m, k), 127, np.int8)
    b = np.full((n, k), 127, np.int8)
    b[:, ::8] = 126
    b[1, :7] = -128
    c = run(mx.array(a), mx.array(b))
    assert emulated.ran(name)
    np.testing.assert_array_equal(np.array(c), oracle.int8_matmul(a, b))


# ---------------------------------------------------------------------------------------
# linear: per-channel (NAX, simd), grouped, GEMV
# ---------------------------------------------------------------------------------------
def check_linear(run, rng, m, n, k, dtype, per_channel, group_size, with_bias):
    x, xv = activation(rng, m, k, dtype)
    w = weight(rng, n, k, per_channel, group_size)
    bias = mx.array(rng.standard_normal(n).astype(np.float32)) if with_bias else None
    y = run(x, w, bias)
    assert y.dtype == x.dtype and y.shape == (m, n)
    want, bound = oracle.linear(xv, w, None if bias is None else np.array(bias))
    oracle.assert_close(y, want, bound, dtype)


# Each kernel compiles once per (dtype, bias, ...) combination, so the dtypes rotate
# over the shapes instead of multiplying them: every dtype and every shape still runs.
@pytest.mark.parametrize("name,run", [("nax_gemm", metal.nax_w8a8_linear), ("simd_gemm", metal.simd_w8a8_linear)])
@pytest.mark.parametrize("m,n,k,with_bias,dtype", [
    (1, 70, 96, True, "bfloat16"),     # decode row through the GEMM (32 x 128 NAX tile); N tail
    (33, 33, 160, False, "float16"),   # M and N tails (guarded edge blocks); K = 5 simd tiles, 5 NAX steps
    (64, 64, 64, True, "float32"),     # exact tiles
])
def test_per_channel_linear(emulated, rng, dtype, name, run, m, n, k, with_bias):
    emulated.need_nax(name == "nax_gemm")
    check_linear(run, rng, m, n, k, dtype, True, 32, with_bias)
    assert emulated.ran(name) and emulated.ran("quantize")


@pytest.mark.parametrize("nax,body", [(True, "nax_gemm"), (False, "simd_gemm")])
@pytest.mark.parametrize("m,n,k,group_size,dtype", [
    (1, 40, 128, 32, "float32"),     # 4 groups, decode row
    (33, 70, 192, 64, "bfloat16"),   # 3 groups of 64: fold every 2 simd tiles / 2 NAX steps; tails
    (64, 33, 256, 128, "float16"),   # 2 groups of 128
])
def test_grouped_linear(emulated, rng, nax, body, dtype, m, n, k, group_size):
    """The grouped candidate runs the NAX kernel where NAX is present, the simd one elsewhere."""
    emulated.need_nax(nax)
    with metal.override(metal=True, nax=nax):
        check_linear(metal.grouped_w8a8_linear, rng, m, n, k, dtype, False, group_size, True)
    assert emulated.ran(body)
    if emulated.sources is not None:
        assert not emulated.ran("simd_gemm" if nax else "nax_gemm")


# M covers every register-array length (MAXM 1, 4, 8, 16) with a guard (3, 7 < MAXM);
# K = 96 is not a multiple of the 128 values one step of 32 lanes covers; N = 37 leaves
# a SIMD-group with 1 of its R (4, or 2 at M = 16) features live.
@pytest.mark.parametrize("m,per_channel,group_size,k,dtype", [
    (1, True, 32, 96, "float32"),
    (7, True, 32, 96, "bfloat16"),
    (16, True, 32, 96, "float16"),    # 16: the largest M the GEMV takes
    (16, False, 32, 96, "float32"),   # grouped: 3 groups, a lane's codes inside one group
    (3, False, 32, 96, "bfloat16"),
    (1, False, 128, 256, "float16"),
    (7, False, 128, 256, "float32"),
])
def test_gemv(emulated, rng, dtype, m, per_channel, group_size, k):
    check_linear(metal.int8_gemv, rng, m, 37, k, dtype, per_channel, group_size, m != 7)
    assert emulated.ran("gemv")


def gemv_flush_case():
    """Inputs on which a GEMV lane's float partial sum passes 2^24 while the total stays
    small: codes +-127 alternating by 4-wide chunk (a lane's chunks all share a sign),
    weights 127 with every 8th 126. K = 40960 gives each lane 320 chunks, |partial| ~
    2.06e7 > 2^24 (odd products then round in float), yet C = -650240 per row is exact
    in float32, so one lost unit shows in the output."""
    k = 40960
    sign = np.where((np.arange(k) // 4) % 2 == 0, 1.0, -1.0).astype(np.float32)
    x = np.stack([sign, -sign])
    w = np.full((4, k), 127.0, np.float32)
    w[:, ::8] = 126.0
    wq = QuantizedWeight.from_float(mx.array(w), group_size=128, per_channel=True)
    return x, wq


def test_gemv_exact_past_2_24(emulated):
    """The GEMV's float FMA accumulation is flushed to int32 every 1024 products; the
    output is checked bit for bit against float32(C) * sa * sw with C exact."""
    x, wq = gemv_flush_case()
    y = np.array(metal.int8_gemv(mx.array(x), wq, None))
    assert emulated.ran("gemv")
    q, sa = oracle.quantize_rows(x)
    c = oracle.int8_matmul(q, (oracle.codes(wq).astype(np.int64) - 128).astype(np.int8))
    assert abs(c).max() < 2**24  # the total is exact in float32; only lane partials are large
    sw = np.array(wq.channel_scales)
    want = (c.astype(np.float32) * sa) * sw[None, :]
    np.testing.assert_array_equal(y, want.astype(np.float32))


def test_gemv_accumulators_fit_in_64_registers():
    """Each lane holds 2 x R x MAXM accumulators (float and int32): at most 64 registers
    for every M the GEMV takes (4 features x 16 rows x 2 was 128, which spills)."""
    seen = {}

    def record(kernel, *, template, output_shapes, output_dtypes, **_):
        seen.update(template)
        return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]

    w = QuantizedWeight.from_float(mx.zeros((8, 64)), group_size=32, per_channel=True)
    previous = metal.set_executor(record)
    try:
        for m in range(1, metal.GEMV_MAX_M + 1):
            metal.int8_gemv(mx.ones((m, 64)), w, None)
            assert 2 * seen["R"] * seen["MAXM"] <= 64, (m, seen)
    finally:
        metal.set_executor(previous)
    assert seen["MAXM"] == 16 and seen["R"] == metal.GEMV_ROWS_16


def refusing_executor(limit, attempts):
    """Stand-in for MLX on a GPU whose pipelines allow ``limit`` threads per group: a
    larger threadgroup raises MLX's error; otherwise the int8 GEMM's exact product."""
    def run(kernel, *, inputs, threadgroup, output_shapes, output_dtypes, **_):
        attempts.append(threadgroup[0])
        if threadgroup[0] > limit:
            raise ValueError(f"Thread group size ({threadgroup[0]}) is greater than  the maximum allowed "
                             f"threads per threadgroup ({limit}).")
        a, b = (np.array(x).astype(np.int64) for x in inputs[:2])
        return [mx.array((a @ b.T).astype(np.int32))]
    return run


def test_nax_tile_refused_by_the_pipeline_is_retried_smaller(rng, monkeypatch):
    """A 512-thread tile MLX refuses (its pipeline's maxTotalThreadsPerThreadgroup is
    lower) runs as the 64 x 64 tile instead, and later calls go there directly."""
    monkeypatch.setattr(metal, "_refused", set())
    monkeypatch.setattr(metal, "_launched", set())
    attempts = []
    previous = metal.set_executor(refusing_executor(448, attempts))
    try:
        for _ in range(2):
            a, b = oracle.random_int8(rng, (40, 64)), oracle.random_int8(rng, (24, 64))
            c = metal.nax_int8_matmul(mx.array(a), mx.array(b), tile="128x128")
            np.testing.assert_array_equal(np.array(c), oracle.int8_matmul(a, b))
    finally:
        metal.set_executor(previous)
    assert attempts == [512, 128, 128]  # refused once, then straight to the smaller tile


def test_nax_tile_refused_at_evaluation_is_retried_smaller(rng, monkeypatch):
    """MLX checks the threadgroup size when it encodes the kernel, at evaluation, not when
    the kernel is called: the first launch of a pipeline is evaluated on the spot, so a
    refusal then is retried with the 64 x 64 tile too (without that evaluation the
    refused array would reach the caller)."""
    monkeypatch.setattr(metal, "_refused", set())
    monkeypatch.setattr(metal, "_launched", set())
    attempts, refused = [], []  # the refused outputs, kept alive (their ids stay unique)

    def lazy_refusal(kernel, *, inputs, threadgroup, **_):
        attempts.append(threadgroup[0])
        a, b = (np.array(x).astype(np.int64) for x in inputs[:2])
        out = mx.array((a @ b.T).astype(np.int32))
        if threadgroup[0] > 448:
            refused.append(out)
        return [out]

    real_eval = mx.eval

    def evaluate(*arrays):
        if any(x is r for x in arrays for r in refused):
            raise ValueError("[metal::Device] Thread group size (512) is greater than  the maximum "
                             "allowed threads per threadgroup (448).")
        real_eval(*arrays)

    monkeypatch.setattr(metal.mx, "eval", evaluate)
    previous = metal.set_executor(lazy_refusal)
    try:
        for _ in range(2):
            a, b = oracle.random_int8(rng, (40, 64)), oracle.random_int8(rng, (24, 64))
            c = metal.nax_int8_matmul(mx.array(a), mx.array(b), tile="128x128")
            assert all(c is not r for r in refused)
            np.testing.assert_array_equal(np.array(c), oracle.int8_matmul(a, b))
    finally:
        metal.set_executor(previous)
    assert attempts == [512, 128, 128]


def test_nax_probe_names_a_tile_that_ran_smaller(monkeypatch):
    """A tile whose pipeline refused its threadgroup size runs as 64 x 64 (as it will in
    use): the probe still turns NAX on, but does not call that tile exact."""
    monkeypatch.setattr(metal, "_refused", set())
    monkeypatch.setattr(metal, "_launched", set())
    previous = metal.set_executor(refusing_executor(448, []))
    try:
        ok, why, definitive = metal.run_nax_probe()
    finally:
        metal.set_executor(previous)
    assert ok and definitive, why
    exact, _, smaller = why.partition("; ")
    assert "128x128" not in exact and "64x128" in exact and "32x128" in exact
    assert smaller == "tiles 128x128 refused by their pipelines' threadgroup limit run as 64x64"


def recording_executor(calls):
    """Stand-in for MLX that records each launch (kernel name, template, inputs) and
    returns zeros: for launch contracts, not numbers."""
    def run(kernel, *, inputs, template, output_shapes, output_dtypes, **_):
        calls.append((kernel, dict(template), inputs))
        return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]
    return run


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("nax", [True, False])
def test_grouped_gemms_read_scales_and_offsets_group_major(bits, nax):
    """The grouped GEMMs' epilogue lanes read neighbouring columns of one group, so the
    scales and offsets go to the kernel as [G, N] (MLX stores [N, G], a stride of G per
    column, as Cider avoids): equal values, transposed, contiguous. The emulated runs
    hold the numbers; a kernel and a layout reverted together would still compute them
    right, and only this contract sees it."""
    n, k, gs = 48, 256, 64
    w = QuantizedWeight.from_float(mx.random.normal((n, k)), group_size=gs, per_channel=False, bits=bits)
    calls = []
    previous = metal.set_executor(recording_executor(calls))
    try:
        with metal.override(metal=True, nax=nax):
            run = metal.grouped_w8a8_linear if bits == 8 else metal.w4a8_linear
            mx.eval(run(mx.ones((40, k), dtype=mx.float16), w, None))
    finally:
        metal.set_executor(previous)
    (gemm,) = [c for c in calls if "TB" in c[1]]  # the GEMM (the quantize has no weight type)
    inputs = dict(zip(metal._GEMM_INPUTS, gemm[2]))
    want_s = np.array(w.scales.astype(mx.float32)).T
    assert inputs["ws"].shape == (k // gs, n) and np.array_equal(np.array(inputs["ws"]), want_s)
    assert inputs["wo"].shape == (k // gs, n)
    assert gemm[1]["GS"] == gs and gemm[1]["MODE"] == 2


def test_one_instantiation_per_tile_for_every_per_channel_group_size():
    """The GEMM's template holds what changes its code and nothing else: no swizzle (the
    kernel computes it from the grid) and the group size only for grouped weights (MODE
    2), so per-channel weights of group size 32, 64 and 128 and the raw int8 GEMM
    compile one NAX pipeline per tile, not one per group size."""
    calls = []
    previous = metal.set_executor(recording_executor(calls))
    try:
        with metal.override(metal=True, nax=True):
            for gs in (32, 64, 128):
                w = QuantizedWeight.from_float(mx.random.normal((64, 256)), group_size=gs, per_channel=True)
                for m in (8, 300):  # a small grid and one past 8 M tiles (swizzled)
                    mx.eval(metal.nax_w8a8_linear(mx.ones((m, 256), dtype=mx.float16), w, None, tile="64x64"))
    finally:
        metal.set_executor(previous)
    templates = {tuple(sorted(c[1].items())) for c in calls if "BM" in c[1]}
    assert len(templates) == 1, templates
    (template,) = templates
    assert not any("SWZ" in name or "SWIZZLE" in name for name, _ in template)
    assert dict(template)["GS"] == 32 and dict(template)["MODE"] == 1


def test_nax_edge_blocks_guard_only_the_ragged_operand():
    """Speed, which results cannot show: a SIMD-group on the last M tile takes the
    guarded (per-element bounds-checked) loads for A only, and B keeps its unguarded
    loads while its N range is whole, and the other way round (as MLX's NAX GEMM
    guards only the unaligned operand). Read from the kernel source: A's loads branch on
    a flag of rows alone, B's on a flag of columns alone."""
    from mlx_w8a8.kernels import sources

    src = sources.read("metal", "nax_gemm.metal")
    assert "const bool a_inside = m_sg + SM <= M;" in src
    assert "const bool b_inside = n_sg + SN <= N;" in src
    a_at, b_at = src.index("if (a_inside && full_k) {"), src.index("if (b_inside && full_k) {")
    a_loads = src[a_at:b_at]
    assert "fa[" in a_loads and "fb[" not in a_loads and "b_inside" not in a_loads
    b_loads = src[b_at:src.index("op.run(", b_at)]
    assert "fb[" in b_loads and "a_inside" not in b_loads


def test_nax_tile_other_errors_are_not_retried(monkeypatch):
    monkeypatch.setattr(metal, "_refused", set())
    monkeypatch.setattr(metal, "_launched", set())

    def broken(kernel, **_):
        raise RuntimeError("Unable to build metal library from source")

    previous = metal.set_executor(broken)
    try:
        with pytest.raises(RuntimeError, match="Unable to build"):
            metal.nax_int8_matmul(mx.zeros((8, 32), dtype=mx.int8), mx.zeros((8, 32), dtype=mx.int8), tile="128x128")
    finally:
        metal.set_executor(previous)
    assert metal._refused == set()


# ---------------------------------------------------------------------------------------
# linear on MLX's 4-bit weights (W4A8): GEMMs (NAX, simd) and the GEMV
# ---------------------------------------------------------------------------------------
def weight4(rng, n, k, group_size):
    """A random 4-bit weight with edge groups where it has rows to spare: row 1's second
    group all zero (codes 0, scale and bias 0: it must add nothing) and row 0's first
    group constant (scale 0, only the bias term b R_g is left); the other groups are
    random codes over 0..15."""
    w = rng.standard_normal((n, k)).astype(np.float32)
    if n >= 2 and k >= 2 * group_size:
        w[1, group_size:2 * group_size] = 0.0
    if n >= 2:
        w[0, :group_size] = 0.75
    return QuantizedWeight.from_float(mx.array(w), group_size=group_size, per_channel=False, bits=4)


def check_linear4(run, rng, m, n, k, dtype, group_size, with_bias):
    x, xv = activation(rng, m, k, dtype)
    w = weight4(rng, n, k, group_size)
    assert w.format == "grouped4"
    if n >= 2 and k >= 2 * group_size:
        assert not np.any(oracle.codes4(w)[1, group_size:2 * group_size])  # the all-zero group
    bias = mx.array(rng.standard_normal(n).astype(np.float32)) if with_bias else None
    y = run(x, w, bias)
    assert y.dtype == x.dtype and y.shape == (m, n)
    want, bound = oracle.linear4(xv, w, None if bias is None else np.array(bias))
    oracle.assert_close(y, want, bound, dtype)


@pytest.mark.parametrize("nax,body", [(True, "nax_gemm"), (False, "simd_gemm")])
@pytest.mark.parametrize("m,n,k,group_size,dtype,with_bias", [
    (1, 40, 128, 32, "float32", True),      # decode row through the GEMM; 4 groups of 32
    (33, 70, 192, 64, "bfloat16", False),   # M and N tails; 3 groups of 64 (fold every 2 tiles / steps)
    (64, 33, 256, 128, "float16", True),    # 2 groups of 128; N tail
    (3, 1, 32, 32, "float32", False),       # a 4-word weight, bound in `constant` space
])
def test_w4a8_linear(emulated, rng, nax, body, dtype, m, n, k, group_size, with_bias):
    """W4A8 through the grouped GEMMs on the packed codes: NAX where NAX is present,
    the simdgroup-matrix kernel elsewhere; against the float64 / int64 oracle."""
    emulated.need_nax(nax)
    with metal.override(metal=True, nax=nax):
        check_linear4(metal.w4a8_linear, rng, m, n, k, dtype, group_size, with_bias)
    assert emulated.ran(body) and emulated.ran("quantize")
    if emulated.sources is not None:
        assert not emulated.ran("simd_gemm" if nax else "nax_gemm")


# M = 1, a guarded row (3, 7 below MAXM 4, 8), M = 16 (MAXM 16, R = 2); N = 37 leaves a
# SIMD-group with one live feature; K = 96 is not a multiple of one 32-lane step (128).
# N = 1, K = 32: the weight is 4 words, fewer than 8 elements, so MLX binds it (and the
# scales) in `constant` space: the helpers' constant overloads.
@pytest.mark.parametrize("m,n,group_size,k,dtype,with_bias", [
    (1, 37, 32, 96, "float32", True),
    (3, 37, 32, 96, "bfloat16", False),
    (7, 37, 64, 192, "float16", True),
    (16, 37, 128, 256, "float32", True),
    (2, 1, 32, 32, "float32", True),
])
def test_w4a8_gemv(emulated, rng, dtype, m, n, group_size, k, with_bias):
    check_linear4(metal.w4a8_gemv, rng, m, n, k, dtype, group_size, with_bias)
    assert emulated.ran("gemv")


def test_w4a8_kernels_read_the_packed_words():
    """No int8 copy of a 4-bit weight: the GEMM's and the GEMV's weight input is the
    weight's own ``[N, K / 8]`` uint32 array, and the kernels take the codes unflipped."""
    seen = []

    def record(kernel, *, inputs, template, output_shapes, output_dtypes, **_):
        seen.append((inputs, dict(template)))
        return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]

    w = QuantizedWeight.from_float(mx.zeros((8, 64)), group_size=32, per_channel=False, bits=4)
    previous = metal.set_executor(record)
    try:
        with metal.override(metal=True, nax=False):
            metal.w4a8_linear(mx.ones((20, 64)), w, None)
            metal.w4a8_gemv(mx.ones((2, 64)), w, None)
    finally:
        metal.set_executor(previous)
    launches = [(i, t) for i, t in seen if "FLIP" in t]  # the GEMM and the GEMV, not quantize
    assert len(launches) == 2
    for inputs, template in launches:
        assert inputs[2] is w.q if "R" in template else inputs[1] is w.q
        assert template["FLIP"] is False and template["MODE"] == 2


def test_w4a8_gemv_refuses_more_than_16_rows(emulated, rng):
    x, _ = activation(rng, 17, 64, "float32", edge_rows=False)
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.linear\] metal_w4a8_gemv takes M in 1..16"):
        metal.w4a8_gemv(x, weight4(rng, 8, 64, 32), None)


def test_gemv_refuses_more_than_16_rows(emulated, rng):
    x, _ = activation(rng, 17, 64, "float32", edge_rows=False)
    with pytest.raises(ValueError, match="M in 1..16"):
        metal.int8_gemv(x, weight(rng, 8, 64, True), None)


# ---------------------------------------------------------------------------------------
# Capabilities and dispatch
# ---------------------------------------------------------------------------------------
def problems():
    return {
        "quantize": Problem("quantize_activation", 8, 0, 64, "float32", "int8"),
        "int8": Problem("int8_matmul", 64, 64, 64, "int8", "int8"),
        "linear": Problem("linear", 64, 64, 64, "float16", "per_channel", 32),
        "decode": Problem("linear", 4, 64, 64, "float16", "per_channel", 32),
        "grouped": Problem("linear", 64, 64, 64, "bfloat16", "grouped", 64),
        "grouped4": Problem("linear", 64, 64, 128, "bfloat16", "grouped4", 64),
        "decode4": Problem("linear", 1, 64, 128, "float16", "grouped4", 128),
        "act_groups": Problem("linear", 64, 64, 128, "bfloat16", "grouped4", 64, False, "group"),
    }


@pytest.mark.parametrize("mac_ver,darwin,want", [
    ("26.2", "25.2.0", (26, 2)),   # a Python built with the macOS 26 SDK reports the truth
    ("16.0", "25.2.0", (26, 2)),   # older SDK: 16.x compatibility version, Darwin 25.2 = macOS 26.2
    ("16.0", "25.1.0", (26, 1)),
    ("15.5", "24.5.0", (15, 5)),   # macOS 15 is reported as it is
    ("", "", None),                # not macOS
    ("26", "", (26, 0)),
])
def test_macos_version(mac_ver, darwin, want):
    assert metal.macos_version(mac_ver, darwin) == want


@pytest.mark.parametrize("macos,arch,want", [
    ((26, 2), "applegpu_g17g", True),    # M5 on the first macOS with NAX
    ((27, 0), "applegpu_g17s", True),
    ((26, 1), "applegpu_g17g", False),   # OS too old
    ((15, 5), "applegpu_g17g", False),
    ((26, 2), "applegpu_g16s", False),   # M4 generation
    ((26, 2), "applegpu_g17p", False),   # a 'p' part needs generation 18
    ((26, 2), "applegpu_g18p", True),
    (None, "applegpu_g17g", False),      # not macOS
    ((26, 2), "x86_64", False),          # not an Apple GPU architecture string
])
def test_nax_rule(macos, arch, want):
    on, reason = metal.nax_rule(macos, arch)
    assert on is want and reason


def test_nax_decision_reads_darwin_and_probes_last():
    """The cpython #135675 case turns NAX on; the build probe runs only when the OS and
    GPU allow NAX, and its failure (or exception) turns NAX off with the reason."""
    calls = []

    def probe(result):
        def run():
            calls.append(result)
            if isinstance(result, Exception):
                raise result
            return result
        return run

    on, why = metal.nax_decision("16.0", "25.2.0", "applegpu_g17g", probe((True, "ok")))
    assert on and "26.2" in why and calls == [(True, "ok")]
    on, why = metal.nax_decision("16.0", "25.2.0", "applegpu_g17g", probe((False, "no MPP header")))
    assert not on and "no MPP header" in why
    on, why = metal.nax_decision("26.2", "25.2.0", "applegpu_g17g", probe(RuntimeError("compile failed")))
    assert not on and "compile failed" in why
    calls.clear()
    on, why = metal.nax_decision("16.0", "25.1.0", "applegpu_g17g", probe((True, "ok")))
    assert not on and "26.1" in why and calls == []  # too old: no probe
    on, why = metal.nax_decision("26.2", "25.2.0", "applegpu_g16s", probe((True, "ok")))
    assert not on and "generation 16" in why and calls == []


def test_probe_is_cached_per_key(tmp_path):
    path = str(tmp_path / "sub" / "nax_probe.json")
    runs = []

    def probe():
        runs.append(1)
        return False, "MLX_METAL_NO_NAX build", True

    assert metal.cached_probe("mlx 1.0", probe, path) == (False, "MLX_METAL_NO_NAX build")
    on, why = metal.cached_probe("mlx 1.0", probe, path)
    assert (on, len(runs)) == (False, 1) and "cached" in why
    metal.cached_probe("mlx 1.1", probe, path)  # another MLX version probes again
    assert len(runs) == 2
    (tmp_path / "sub" / "nax_probe.json").write_text("{not json")
    assert metal.cached_probe("mlx 1.0", probe, path)[0] is False and len(runs) == 3  # corrupt: re-probe


def test_transient_probe_failure_is_not_cached(tmp_path):
    """A failure the probe does not call definitive (a GPU timeout, memory pressure) is
    reported but not remembered: the next call probes again and can succeed."""
    path = str(tmp_path / "nax_probe.json")
    answers = [(False, "RuntimeError: command buffer timed out", False), (True, "exact", True)]
    assert metal.cached_probe("k", lambda: answers.pop(0), path)[0] is False
    assert metal.cached_probe("k", lambda: answers.pop(0), path) == (True, "exact")
    assert metal.cached_probe("k", lambda: pytest.fail("probed again"), path) == (True, "exact (cached)")


@pytest.fixture
def nax_machine(monkeypatch, tmp_path):
    """An M5-class Mac on the CPU: OS, GPU and probe stubbed, the probe cache in tmp."""
    runs = []
    state = {"metal": (True, "Metal GPU is MLX's default device"), "probe": (True, "exact", True)}
    monkeypatch.setattr(metal, "metal_status", lambda: state["metal"])
    monkeypatch.setattr(metal, "_device_arch", lambda: "applegpu_g17s")
    monkeypatch.setattr(metal, "_os_versions", lambda: ("26.2", "25.2.0"))
    monkeypatch.setattr(metal, "_probe_cache_path", lambda: str(tmp_path / "nax_probe.json"))
    monkeypatch.setattr(metal, "run_nax_probe", lambda: runs.append(1) or state["probe"])
    monkeypatch.setattr(metal, "_nax_memo", {})
    return state, runs


def test_cpu_default_device_at_first_call_does_not_disable_nax(nax_machine):
    """The first NAX query of a process made while the CPU is MLX's default device says
    no, and a later query on the GPU probes and says yes."""
    state, runs = nax_machine
    state["metal"] = (False, "MLX's default device is Device(cpu, 0), not the Metal GPU")
    assert metal._native_nax()[0] is False and runs == []
    state["metal"] = (True, "Metal GPU is MLX's default device")
    on, why = metal._native_nax()
    assert on and runs == [1] and "exact" in why
    assert metal._native_nax()[0] and runs == [1]  # decided once per process


def test_transient_probe_failure_is_retried_in_the_process(nax_machine):
    state, runs = nax_machine
    state["probe"] = (False, "RuntimeError: command buffer timed out", False)
    assert metal._native_nax()[0] is False
    state["probe"] = (True, "exact", True)
    assert metal._native_nax()[0] is True and runs == [1, 1]


def test_probe_key_holds_kernel_digest_and_versions():
    import mlx_w8a8

    key = metal.nax_probe_key("applegpu_g17s", "26.2", "25.2.0")
    digest = registry.get("int8_matmul", "metal_nax_int8_gemm").digest
    for part in (digest, mlx_w8a8.__version__, mx.__version__, "applegpu_g17s", "26.2", "25.2.0"):
        assert part in key


def test_nax_probe_runs_every_tile_in_the_emulator():
    """The probe runs the real nax_gemm for each tile on a ragged problem (emulated
    here) and passes only when every tile is exact."""
    previous = metal.set_executor(harness.executor)
    try:
        ok, why, definitive = metal.run_nax_probe()
        ran = set(harness.executor.sources)
    finally:
        metal.set_executor(previous)
    assert ok and definitive, why
    for tile in metal.NAX_TILES:
        bm, bn, _, _ = metal.NAX_TILES[tile]
        assert any(name.startswith(f"custom_kernel_w8a8_nax_gemm__{bm}_{bn}_") for name in ran), tile


def test_nax_probe_refuses_wrong_results_definitively():
    """A kernel that runs but computes the wrong numbers (here: every output 0) turns NAX
    off, and that answer is cached (a layout-blind all-ones check would pass ones x ones)."""
    def zeros(kernel, *, output_shapes, output_dtypes, **_):
        return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]

    previous = metal.set_executor(zeros)
    try:
        ok, why, definitive = metal.run_nax_probe()
    finally:
        metal.set_executor(previous)
    assert not ok and definitive and "differ from exact integer math" in why


def test_probe_failure_is_a_reason_not_an_error():
    def broken(kernel, **kwargs):
        raise RuntimeError("Unable to build metal library from source\nerror: no MetalPerformancePrimitives")

    previous = metal.set_executor(broken)
    try:
        on, why, definitive = metal.run_nax_probe()
    finally:
        metal.set_executor(previous)
    assert not on and definitive and "Unable to build metal library" in why


def test_metal_follows_the_default_device(monkeypatch):
    """A Metal build whose default device is the CPU offers no Metal candidate."""
    monkeypatch.setattr(metal, "_metal_built", lambda: True)
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    try:
        on, why = metal.metal_status()
        assert not on and "default device" in why
        assert not metal.metal_available() and not metal.nax_available()
        assert metal.pick(problems()["int8"]) is None
    finally:
        mx.set_default_device(previous)


def test_no_metal_offers_nothing():
    """This machine has no Metal: every Metal candidate is registered, none is offered,
    forcing one is a clear ValueError, and the fallback still answers."""
    absent = contextlib.nullcontext() if not mx.metal.is_available() else metal.override(metal=False)
    with absent:
        check_nothing_offered()


def test_detection_follows_mlx():
    """Without an override, Metal is what MLX reports for its default device (no Metal
    on the CI machine), and the reasons say why."""
    want = bool(mx.metal.is_available()) and mx.default_device().type == mx.gpu
    assert metal.metal_available() == want
    report = metal.status()
    assert set(report) == {"metal", "nax"} and all(reason for _, reason in report.values())
    if not mx.metal.is_available():
        assert not metal.nax_available()
        assert "no Metal backend" in report["metal"][1]


def check_nothing_offered():
    assert not metal.metal_available() and not metal.nax_available()
    metal_names = {c.name for c in registry.all_candidates() if c.backend == "metal"}
    tiles = {f"metal_nax_{op}_gemm_{t}" for op in ("int8", "w8a8") for t in metal.NAX_TILES}
    assert metal_names == {"metal_quantize", "metal_nax_int8_gemm", "metal_simd_int8_gemm",
                           "metal_nax_w8a8_gemm", "metal_simd_w8a8_gemm",
                           "metal_w8a8_gemm_grouped", "metal_int8_gemv", "metal_w4a8_gemm",
                           "metal_w4a8_gemv", "metal_gemm_act_groups"} | tiles
    for problem in problems().values():
        offered = registry.names(registry.candidates(problem))
        assert not [n for n in offered if n.startswith("metal_")], offered
        assert metal.pick(problem) is None
        assert registry.choose(problem).backend == "any"
    with pytest.raises(ValueError, match="cannot run"):
        registry.choose(problems()["int8"], "metal_simd_int8_gemm")


@pytest.mark.parametrize("nax,want", [
    (False, {"quantize": "metal_quantize", "int8": "metal_simd_int8_gemm",
             "linear": "metal_simd_w8a8_gemm", "decode": "metal_int8_gemv",
             "grouped": "metal_w8a8_gemm_grouped", "grouped4": "metal_w4a8_gemm",
             "decode4": "metal_w4a8_gemv", "act_groups": "metal_gemm_act_groups"}),
    (True, {"quantize": "metal_quantize", "int8": "metal_nax_int8_gemm",
            "linear": "metal_nax_w8a8_gemm", "decode": "metal_int8_gemv",
            "grouped": "metal_w8a8_gemm_grouped", "grouped4": "metal_w4a8_gemm",
            "decode4": "metal_w4a8_gemv", "act_groups": "metal_gemm_act_groups"}),
])
def test_override_picks_nax_or_fallback(nax, want):
    with metal.override(metal=True, nax=nax):
        assert metal.nax_available() is nax
        got = {key: metal.pick(p).name for key, p in problems().items()}
        assert got == want
        offered = registry.names(registry.candidates(problems()["int8"]))
        assert ("metal_nax_int8_gemm" in offered) is nax
        assert "metal_simd_int8_gemm" in offered  # the fallback runs on every Apple GPU
    if not mx.metal.is_available():
        assert metal.pick(problems()["int8"]) is None  # the override is gone again


def test_nax_needs_metal():
    with metal.override(metal=False, nax=True):
        assert not metal.nax_available()


def test_override_validates():
    with pytest.raises(ValueError, match="nax must be True, False or None"):
        with metal.override(nax="yes"):
            pass


@pytest.mark.parametrize("nax,body", [(True, "nax_gemm"), (False, "simd_gemm")])
def test_public_ops_dispatch_to_metal(emulated, rng, nax, body):
    """Through the public ops with a forced kernel name, as a user on a Mac would."""
    emulated.need_nax(nax)
    with metal.override(metal=True, nax=nax):
        name = "metal_nax_w8a8_gemm" if nax else "metal_simd_w8a8_gemm"
        x, xv = activation(rng, 5, 64, "float16", edge_rows=False)
        w = weight(rng, 24, 64, True)
        y = ops.w8a8_linear(x, w, kernel=name)
        want, bound = oracle.linear(xv, w, None)
        oracle.assert_close(y, want, bound, "float16")
        a, b = oracle.random_int8(rng, (3, 48)), oracle.random_int8(rng, (5, 48))
        c = ops.int8_matmul(mx.array(a), mx.array(b), kernel=name.replace("w8a8", "int8"))
        np.testing.assert_array_equal(np.array(c), oracle.int8_matmul(a, b))
    assert emulated.ran(body)


def test_digests_name_the_sources():
    """A kernel edit changes the digest, so tuning-table entries become stale."""
    digests = {c.name: c.digest for c in registry.all_candidates() if c.backend == "metal"}
    assert all(len(d) == 16 for d in digests.values())
    assert digests["metal_nax_int8_gemm"] != digests["metal_simd_int8_gemm"]


# ---------------------------------------------------------------------------------------
# activation groups (act_scales="group"): the quantize per group, the grouped GEMMs
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,m,k,group_size", [
    ("bfloat16", 7, 192, 64),    # edge rows: zero row, NaN, +Inf, .5 ties; 3 groups
    ("float32", 33, 640, 32),    # more groups (20) than SIMD-groups (8)
    ("float16", 2, 128, 128),    # one group per row
])
def test_quantize_act_groups_matches_oracle(emulated, rng, dtype, m, k, group_size):
    x, xv = activation(rng, m, k, dtype)
    if m >= 7:
        x = mx.array(np.where(np.arange(k) == 5, 300.0, 1.0) * xv).astype(getattr(mx, dtype))
        xv = oracle.to_numpy(x).astype(np.float32)
    q, t, rs = metal.quantize(x, group_size, act_groups=True)
    q_want, t_want = oracle.quantize_groups(xv, group_size)
    np.testing.assert_array_equal(np.array(q), q_want)
    np.testing.assert_array_equal(np.array(t), t_want)
    np.testing.assert_array_equal(
        np.array(rs), q_want.astype(np.int64).reshape(m, k // group_size, group_size).sum(-1))
    assert emulated.ran("quantize")


@pytest.mark.parametrize("nax,body", [(True, "nax_gemm"), (False, "simd_gemm")])
@pytest.mark.parametrize("bits,m,n,k,group_size,dtype,with_bias", [
    (8, 33, 70, 192, 64, "bfloat16", True),   # M and N tails; 3 groups of 64
    (4, 1, 40, 128, 32, "float32", False),    # decode row through the GEMM; 4 groups of 32
    (4, 64, 33, 256, 128, "float16", True),   # 2 groups of 128
])
def test_act_groups_linear(emulated, rng, nax, body, bits, m, n, k, group_size, dtype, with_bias):
    """metal_gemm_act_groups against the float64 oracle of the activation-group math,
    8-bit grouped and 4-bit weights; a per-token result (the grouped candidate's) fails
    the same comparison wherever a group's scale differs from its row's."""
    emulated.need_nax(nax)
    x, xv = activation(rng, m, k, dtype)
    # one channel 64x the rest (a power of two: still exact in the dtype), so the group
    # scales differ from the row's in every row and the per-token result must miss
    xv = xv.copy()
    xv[:, 1] *= 64.0
    x = mx.array(xv).astype(x.dtype)
    w = weight(rng, n, k, False, group_size) if bits == 8 else weight4(rng, n, k, group_size)
    bias = mx.array(rng.standard_normal(n).astype(np.float32)) if with_bias else None
    with metal.override(metal=True, nax=nax):
        y = metal.act_groups_linear(x, w, bias)
        token = (metal.grouped_w8a8_linear if bits == 8 else metal.w4a8_linear)(x, w, bias)
    assert y.dtype == x.dtype and y.shape == (m, n)
    want, bound = oracle.linear_act_groups(xv, w, None if bias is None else np.array(bias))
    oracle.assert_close(y, want, bound, dtype)
    assert emulated.ran(body) and emulated.ran("quantize")
    # the two maths differ: the per-token result fails the comparison above (a margin
    # such as "10x the bound somewhere" failed now and then at M = 1 on fresh data)
    with pytest.raises(AssertionError, match="max excess"):
        oracle.assert_close(token, want, bound, dtype)
    registry_problem = Problem("linear", m, n, k, dtype, "grouped" if bits == 8 else "grouped4",
                               group_size, with_bias, "group")
    assert registry.get("linear", "metal_gemm_act_groups").supports(registry_problem)
