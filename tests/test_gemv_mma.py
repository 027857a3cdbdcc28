"""The tensor-core small-M GEMV (``cuda_int8_gemv_mma``, ``gemv_mma.cu``) without a GPU: a
model of how its lanes load a step of 64 codes and build mma.sync m16n8k32 fragments
from them (the PTX fragment layouts), showing that the step's k-permutation leaves every
dot product as it is, for the weights, for the activation-code sums (an A of ones) and
for every lane; a mutant mapping the model must fail; the 4-bit form's loads (the byte
offset of each lane's 8 bytes, gemv.cuh's expand_word4 modelled with CUDA's byte
permute) giving each lane the codes the 8-bit path's bytes hold, a mutant expansion
caught; and the launches the definitions make (grid, block, template, the stored 4-bit
arrays) and what they refuse."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import mlx.core as mx

import oracle
from kernel_recorder import record_launches
from mlx_w8a8 import QuantizedWeight
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.cuda import gemv as cuda_gemv, launch
from mlx_w8a8.kernels.registry import Problem


def words(chunk: np.ndarray) -> list[np.ndarray]:
    """A lane's 16 loaded bytes as its four 32-bit words' bytes (element order)."""
    return [chunk[4 * i:4 * i + 4] for i in range(4)]


def a_fragments(rows16: np.ndarray, h: int) -> list[list[np.ndarray]]:
    """Each lane's four A registers for half ``h`` of a step, as gemv_mma.cu builds
    them: lane (g, t) holds codes 16 t .. 16 t + 15 of rows g and g + 8."""
    out = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        wa, wb = words(rows16[g, 16 * t:16 * t + 16]), words(rows16[g + 8, 16 * t:16 * t + 16])
        out.append([wa[2 * h], wb[2 * h], wa[2 * h + 1], wb[2 * h + 1]])
    return out


def b_fragments(tokens8: np.ndarray, h: int) -> list[list[np.ndarray]]:
    """Each lane's two B registers: lane (g, t) holds codes 16 t .. 16 t + 15 of token g."""
    out = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        x = words(tokens8[g, 16 * t:16 * t + 16])
        out.append([x[2 * h], x[2 * h + 1]])
    return out


def mma_m16n8k32(a_frags, b_frags) -> np.ndarray:
    """D = A B as mma.sync.m16n8k32 reads its fragments (PTX ISA, the .s8 layouts): A
    element (row, col) in lane 4 (row % 8) + (col % 16) / 4, register (row >= 8) + 2
    (col >= 16), byte col % 4; B element (k, n) in lane 4 n + (k % 16) / 4, register
    k >= 16, byte k % 4."""
    a = np.zeros((16, 32), np.int64)
    b = np.zeros((32, 8), np.int64)
    for row in range(16):
        for col in range(32):
            lane = 4 * (row % 8) + (col % 16) // 4
            a[row, col] = a_frags[lane][int(row >= 8) + 2 * int(col >= 16)][col % 4]
    for k in range(32):
        for n in range(8):
            b[k, n] = b_frags[4 * n + (k % 16) // 4][int(k >= 16)][k % 4]
    return a @ b


def step(rows16, tokens8, a_of=a_fragments):
    """One step's sums (two MMAs, halves 0 and 1) as the kernel accumulates them."""
    return sum(mma_m16n8k32(a_of(rows16, h), b_fragments(tokens8, h)) for h in (0, 1))


def test_the_step_permutation_keeps_every_dot_product():
    rng = np.random.default_rng(0)
    for _ in range(3):
        w = rng.integers(-128, 128, (16, 64)).astype(np.int64)  # the flipped codes q - 128
        x = rng.integers(-127, 128, (8, 64)).astype(np.int64)
        np.testing.assert_array_equal(step(w, x), w @ x.T)
        # The activation-code sums: an A of ones gives R for every row, in C's layout.
        np.testing.assert_array_equal(step(np.ones_like(w), x), np.tile(x.sum(1), (16, 1)))


def test_a_mutant_mapping_is_caught():
    # Rows g and g + 8 swapped in the A registers: every dot product moves.
    def swapped(rows16, h):
        return [[f[1], f[0], f[3], f[2]] for f in a_fragments(rows16, h)]

    rng = np.random.default_rng(1)
    w = rng.integers(-128, 128, (16, 64)).astype(np.int64)
    x = rng.integers(-127, 128, (8, 64)).astype(np.int64)
    assert not np.array_equal(step(w, x, swapped), w @ x.T)


def make_weight(rng, n, k, group_size, per_channel):
    w = rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)
    return QuantizedWeight.from_float(mx.array(w).astype(mx.bfloat16), group_size=group_size,
                                      per_channel=per_channel)


def run_recorded(monkeypatch, name, m, weight):
    """``name``'s candidate run on ``[m, K]`` zeros with launches recorded: (output,
    the launches)."""
    rec = record_launches(monkeypatch)
    launch._kernel.cache_clear()
    try:
        y = registry.get("linear", name).run(mx.zeros((m, weight.k), dtype=mx.bfloat16), weight, None)
    finally:
        launch._kernel.cache_clear()
    return y, rec.launches


def sibling_and_first_alone(monkeypatch, ns, seed, m=32):
    """The recorded launches of a sibling GEMV launch of group-wise weights ``[N, 256]``
    for ``N`` in ``ns``, then of its first member alone, at ``m`` tokens."""
    rec = record_launches(monkeypatch)
    rng = np.random.default_rng(seed)
    members = [(make_weight(rng, n, 256, 64, per_channel=False), None) for n in ns]
    xq, xs = mx.zeros((m, 256), dtype=mx.int8), mx.ones((m, 1))
    launch._kernel.cache_clear()
    try:
        cuda_gemv.gemv_mma_group_spec(m, members, mx.bfloat16).launch(xq, xs)
        cuda_gemv.gemv_mma_spec(m, members[0][0], None, mx.bfloat16).launch(xq, xs)
    finally:
        launch._kernel.cache_clear()
    group, alone = rec.launches
    return group, alone


@pytest.mark.parametrize("m,n,nt,rows,warps", [
    (1, 264, 1, 1, 8), (16, 4096, 2, 1, 8), (17, 20000, 3, 1, 2), (32, 128256, 4, 2, 2),
    (25, 4096, 4, 2, 8), (32, 1024, 4, 1, 8)])
def test_the_launch(monkeypatch, m, n, nt, rows, warps):
    weight = make_weight(np.random.default_rng(2), n, 256, 64, per_channel=False)
    y, (quantize, mma) = run_recorded(monkeypatch, "cuda_int8_gemv_mma", m, weight)
    assert y.shape == (m, n) and y.dtype == mx.bfloat16
    assert quantize["name"].startswith("w8a8_quantize_plain")
    assert mma["name"].startswith("w8a8_gemv_mma_grouped")
    tpl = dict(mma["template"])
    assert (tpl["NT"], tpl["W"], tpl["GS"], tpl["RT"]) == (nt, warps, 64, rows)
    # One block of W warps per 16 RT weight rows.
    assert mma["threadgroup"] == (32 * warps, 1, 1)
    assert mma["grid"] == (-(-n // (16 * rows)) * 32 * warps, 1, 1)


@pytest.mark.parametrize("m,n,bits,per_channel,warps", [
    (32, 14336, 8, False, 2),    # 448 blocks of two row tiles: at least 3 x 132
    (32, 12672, 8, False, 2),    # 396 blocks, the threshold
    (32, 12640, 8, False, 8),    # 395 blocks
    (16, 6336, 8, False, 2),     # 396 blocks of one row tile
    (16, 6320, 8, False, 8),
    (32, 4096, 8, False, 8),     # 128 blocks (o_proj, down_proj's N)
    (8, 128256, 8, False, 2),
    (32, 128256, 4, False, 2),   # 4-bit codes: one row tile, 8016 blocks
    (16, 14336, 4, False, 2),    # 896 blocks
    (32, 4096, 4, False, 8),     # 256 blocks
    (32, 128256, 8, True, 8),    # per-channel codes: not measured with fewer warps
])
def test_warps_follow_the_launchs_blocks(monkeypatch, m, n, bits, per_channel, warps):
    monkeypatch.setattr(cuda_gemv, "SMS", 132)
    assert cuda_gemv.mma_warps(m, n, bits, per_channel) == warps


def test_a_sibling_launch_takes_warps_by_its_summed_rows(monkeypatch):
    """gate/up at 8192 rows each (256 blocks of two tiles, 8 warps alone) launch as 512
    blocks together: 2 warps, so their partials add in another order than alone."""
    monkeypatch.setattr(cuda_gemv, "SMS", 132)
    group, alone = sibling_and_first_alone(monkeypatch, (8192, 8192), seed=5)
    assert dict(group["template"])["W"] == 2 and group["grid"] == (512 * 64, 1, 1)
    assert dict(alone["template"])["W"] == 8 and alone["grid"] == (256 * 256, 1, 1)


@pytest.mark.parametrize("m,n,rows", [
    (32, 4096, 2), (25, 4096, 2),   # four token tiles, 128 blocks of two tiles
    (24, 4096, 1), (17, 128256, 1), (16, 128256, 1), (8, 128256, 1),  # fewer token tiles
    (32, 3360, 1), (32, 3361, 2),   # 105 / 106 blocks of two tiles against 0.8 x 132 SMs
    (32, 1024, 1),                  # 32 blocks of two tiles: one tile a block
])
def test_row_tiles_where_four_token_tiles_fill_the_gpu(m, n, rows):
    """Two tiles of rows a block only for 8-bit codes at four token tiles (M = 25-32,
    where one tile a block read x from L2 too often: docs/cuda.md) and only where the
    launch's blocks still fill the GPU (WAVE_FILL x SMS of them); 4-bit codes keep one
    (two were slower there)."""
    assert cuda_gemv.mma_row_tiles(m, n) == cuda_gemv.mma_row_tiles(m, n, 8) == rows
    assert cuda_gemv.mma_row_tiles(m, n, 4) == 1
    assert -(-3361 // 32) >= cuda_gemv.WAVE_FILL * launch.SMS > -(-3360 // 32)


def test_a_sibling_launch_takes_row_tiles_by_its_summed_rows(monkeypatch):
    """A sibling launch fills the GPU with every member's blocks, so its row tiles follow
    the members' summed N (each member's own launch its own N)."""
    group, alone = sibling_and_first_alone(monkeypatch, (2048, 2048), seed=6)
    assert dict(group["template"])["RT"] == 2 and group["grid"] == (128 * 256, 1, 1)
    assert dict(alone["template"])["RT"] == 1 and alone["grid"] == (128 * 256, 1, 1)


@pytest.mark.parametrize("m,n,rows,blocks", [(8, 264, 4, 5), (16, 4096, 2, 128), (16, 4100, 4, 65),
                                             (32, 20000, 2, 625)])
def test_more_row_tiles_make_fewer_blocks(monkeypatch, m, n, rows, blocks):
    """``rows`` tiles of 16 weight rows a block (RT): ceil(N / (16 RT)) blocks of the
    same warps (8, or 2 from 3 x SMS blocks), alone and as one member of a sibling launch."""
    rec = record_launches(monkeypatch)
    rng = np.random.default_rng(4)
    weight = make_weight(rng, n, 256, 64, per_channel=False)
    xq, xs = mx.zeros((m, 256), dtype=mx.int8), mx.ones((m, 1))
    launch._kernel.cache_clear()
    try:
        cuda_gemv.gemv_mma_spec(m, weight, None, mx.bfloat16, rows=rows).launch(xq, xs)
        other = make_weight(rng, 40, 256, 64, per_channel=False)
        cuda_gemv.gemv_mma_group_spec(m, [(weight, None), (other, None)], mx.bfloat16,
                                      rows=rows).launch(xq, xs)
    finally:
        launch._kernel.cache_clear()
    alone, group = rec.launches
    assert dict(alone["template"])["RT"] == dict(group["template"])["RT"] == rows
    w_alone, w_group = dict(alone["template"])["W"], dict(group["template"])["W"]
    assert (w_alone, w_group) == ((2, 2) if blocks >= 3 * cuda_gemv.SMS else (8, 8))
    assert alone["grid"] == (blocks * 32 * w_alone, 1, 1)
    assert alone["threadgroup"] == (32 * w_alone, 1, 1)
    assert group["grid"] == ((blocks + -(-40 // (16 * rows))) * 32 * w_group, 1, 1)


@pytest.mark.parametrize("m,rows", [(16, 3), (16, 8), (17, 4), (32, 4), (1, 0)])
def test_row_tiles_are_refused_past_the_kernel(m, rows):
    """RT is 1, 2 or 4 and RT x token tiles <= 8 (the partials' shared memory)."""
    weight = make_weight(np.random.default_rng(5), 64, 256, 64, per_channel=False)
    with pytest.raises(ValueError, match=rf"\[mlx_w8a8.cuda_int8_gemv_mma\] row tiles must be "
                                         rf"1, 2 or 4 .* got {rows}"):
        cuda_gemv.gemv_mma_spec(m, weight, None, mx.bfloat16, rows=rows)


@pytest.mark.parametrize("name,problem,why", [
    ("cuda_int8_gemv_mma", Problem("linear", 33, 256, 256, "bfloat16", "grouped", 64, False),
     "M must be in [1, 32], got 33"),
    ("cuda_int8_gemv_mma", Problem("linear", 16, 256, 256, "bfloat16", "grouped", 32, False),
     "group size must be one of (64, 128)"),
    ("cuda_int8_gemv_mma", Problem("linear", 16, 256, 96, "bfloat16", "per_channel", 64, False),
     "K must be a multiple of 64"),
    ("cuda_int8_gemv_mma", Problem("linear", 16, 256, 256, "bfloat16", "grouped4", 64, False),
     "weight format"),
    ("cuda_w4a8_gemv_mma", Problem("linear", 16, 256, 256, "bfloat16", "grouped4", 32, False),
     "group size must be one of (64, 128)"),
    ("cuda_w4a8_gemv_mma", Problem("linear", 16, 256, 256, "bfloat16", "grouped", 64, False),
     "weight format"),
])
def test_it_refuses_what_it_cannot_take(monkeypatch, name, problem, why):
    monkeypatch.setattr(launch, "cuda_available", lambda: True)
    ok, reason = registry.get("linear", name).can_implement(problem)
    assert not ok and why in reason and reason.startswith(f"[mlx_w8a8.{name}]")
    fine = Problem("linear", 16, 256, 256, "bfloat16",
                   "grouped" if name == "cuda_int8_gemv_mma" else "grouped4", 128, True)
    assert registry.get("linear", name).can_implement(fine) == (True, "")


def test_siblings_are_one_launch_on_one_quantize(monkeypatch):
    rec = record_launches(monkeypatch)
    rng = np.random.default_rng(3)
    k, m = 256, 16
    members = [(make_weight(rng, n, k, 128, per_channel=False), None) for n in (4096, 1024, 1024)]
    cand = registry.get("linear", "cuda_int8_gemv_mma")
    problem = Problem("linear", m, 6144, k, "bfloat16", "grouped", 128, False)
    launch._kernel.cache_clear()
    try:
        key, quantize, apply = cand.bind_group(problem, members)
        ys = apply(quantize(mx.zeros((m, k), dtype=mx.bfloat16)))
    finally:
        launch._kernel.cache_clear()
    assert [y.shape for y in ys] == [(16, 4096), (16, 1024), (16, 1024)]
    quantize_launch, group = rec.launches
    assert quantize_launch["name"].startswith("w8a8_quantize_plain")
    assert group["name"].startswith("w8a8_gemv_mma_grouped_group3")
    # The members' blocks one after another: 256 + 64 + 64 of 8 warps.
    assert group["grid"] == (384 * 256, 1, 1) and group["threadgroup"] == (256, 1, 1)
    mixed = [members[0], (make_weight(rng, 1024, k, 128, per_channel=True), None)]
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.cuda_int8_gemv_mma\] sibling weights"):
        cand.bind_group(Problem("linear", m, 5120, k, "bfloat16", "grouped", 128, False), mixed)


def test_the_4bit_form_reads_the_stored_arrays(monkeypatch):
    m, n, k = 16, 40, 256
    w = mx.array(np.random.default_rng(4).standard_normal((n, k)).astype(np.float32))
    weight = QuantizedWeight.from_float(w.astype(mx.bfloat16), group_size=128, per_channel=False,
                                        bits=4)
    y, (_, mma) = run_recorded(monkeypatch, "cuda_w4a8_gemv_mma", m, weight)
    assert y.shape == (m, n)
    assert mma["name"].startswith("w8a8_gemv_mma_grouped4")
    # The packed codes, scales and biases as stored: no int8 copy of the weight.
    assert mma["inputs"] == ["xq", "xs", "w", "ws", "wo"]
    assert [tuple(a.shape) for a in mma["arrays"][2:]] == [(n, k // 8), (n, 2), (n, 2)]
    assert mma["arrays"][2] is weight.q and mma["arrays"][4] is weight.biases
    assert dict(mma["template"])["GS"] == 128


def test_the_4bit_form_keeps_one_row_tile_where_the_8bit_form_takes_two(monkeypatch):
    """At M = 32 on 4096 rows the 8-bit form owns two tiles a block, the 4-bit form one."""
    rng = np.random.default_rng(7)
    w = mx.array(rng.standard_normal((4096, 256)).astype(np.float32)).astype(mx.bfloat16)
    for bits, rows in ((8, 2), (4, 1)):
        weight = QuantizedWeight.from_float(w, group_size=64, per_channel=False, bits=bits)
        name = "cuda_int8_gemv_mma" if bits == 8 else "cuda_w4a8_gemv_mma"
        _, (_, mma) = run_recorded(monkeypatch, name, 32, weight)
        assert dict(mma["template"])["RT"] == rows, bits
        assert mma["grid"] == (4096 // (16 * rows) * 256, 1, 1), bits


def byte_perm(x: int, y: int, s: int) -> int:
    """CUDA's __byte_perm(x, y, s): byte i of the result is byte (s >> 4 i) & 7 of the
    eight bytes x (0-3) then y (4-7)."""
    pool = (x | (y << 32)).to_bytes(8, "little")
    return int.from_bytes(bytes(pool[(s >> (4 * i)) & 7] for i in range(4)), "little")


def expand_word4(w: int, selectors=(0x5140, 0x7362)) -> bytes:
    """gemv.cuh's expand_word4, step by step: eight 4-bit codes as eight bytes."""
    lo, hi = w & 0x0F0F0F0F, (w >> 4) & 0x0F0F0F0F
    return b"".join(byte_perm(lo, hi, s).to_bytes(4, "little") for s in selectors)


def lane_codes4(packed_row: bytes, k: int, step: int, t: int, selectors=(0x5140, 0x7362)) -> list:
    """The 16 codes lane t of gemv_mma.cu's 4-bit path holds for one step: the 8 bytes at
    bytes_of(64 step + 16 t) = (64 step + 16 t) / 2 of the row, expanded word by word."""
    at = (64 * step + 16 * t) // 2
    words = [int.from_bytes(packed_row[at + 4 * i:at + 4 * i + 4], "little") for i in (0, 1)]
    return list(b"".join(expand_word4(w, selectors) for w in words))


def test_the_4bit_lanes_hold_their_codes_in_element_order():
    # MLX's packing (code j of a word in bits 4j .. 4j + 3; oracle.codes4 unpacks it) read
    # as the kernel reads it: each lane's 16 codes of each step are codes 64 step + 16 t
    # ... of the row, in order (the positions the 8-bit path's bytes hold).
    rng = np.random.default_rng(5)
    n, k = 3, 256
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32)).astype(mx.bfloat16)
    weight = QuantizedWeight.from_float(w, group_size=64, per_channel=False, bits=4)
    want = oracle.codes4(weight)
    rows = np.array(weight.q).view(np.uint8)
    assert rows.shape == (n, k // 2) and len(np.unique(want)) > 8
    for r in range(n):
        for step in range(k // 64):
            for t in range(4):
                got = lane_codes4(rows[r].tobytes(), k, step, t)
                assert got == list(want[r, 64 * step + 16 * t:64 * step + 16 * t + 16]), (r, step, t)
    # A mutant with the two selectors swapped puts codes 4-7 before 0-3: caught.
    bad = lane_codes4(rows[0].tobytes(), k, 0, 0, selectors=(0x7362, 0x5140))
    assert bad != list(want[0, :16])


GEMV_CUH = Path(__file__).resolve().parent.parent / "mlx_w8a8" / "shaders" / "cuda" / "gemv.cuh"


def biased_constants() -> tuple[int, float]:
    """``kBiased`` and the float ``biased_to_float`` subtracts, as gemv.cuh spells them."""
    text = GEMV_CUH.read_text()
    bias = re.search(r"constexpr int kBiased = (0x[0-9A-Fa-f]+);", text)
    sub = re.search(r"__fsub_rn\(__int_as_float\(biased\), ([0-9.]+)f\)", text)
    assert bias and sub, "gemv.cuh no longer spells kBiased / biased_to_float as expected"
    return int(bias.group(1), 16), float(sub.group(1))


def biased_to_float(v: np.ndarray, bias: int, sub: float) -> np.ndarray:
    """The kernels' conversion in float32 numpy: the int32 sum started at ``bias`` (an
    MMA's or dp4a's wrapping int32 accumulator), its bits read as a float32, minus
    ``sub`` (numpy's float32 subtract rounds to nearest, as ``__fsub_rn``)."""
    biased = (v.astype(np.int64) + bias).astype(np.uint32)
    return biased.view(np.float32) - np.float32(sub)


def test_biased_sums_convert_exactly_over_a_groups_range():
    # The grouped GEMVs start each group's int32 sums (weight products P, activation-code
    # sums R) at kBiased and convert them with one float subtract instead of an I2F. Exact
    # only for |v| < 2^22: the largest |P| a group can reach (128 codes of 127 times
    # q - 128 = -128; the extreme-code GPU tests drive it) must lie inside, and every
    # value of that range must come back as itself.
    bias, sub = biased_constants()
    reach = 128 * 127 * 128
    edges = np.array([0, 1, -1, reach, -reach, 2**22 - 1, -(2**22)], np.int64)
    v = np.concatenate([edges, np.random.default_rng(0).integers(-reach, reach + 1, 100_000)])
    assert np.array_equal(biased_to_float(v, bias, sub).astype(np.int64), v)
    # 4-bit products (codes 0..15) and R (at most 128 * 127) lie well inside.
    assert 128 * 127 * 15 < reach and reach < 2**22
    # Mutants: a start at 2^23 (0x4B000000) reads negative sums as other floats; one at
    # 2^23 + 2^21 (0x4B200000) keeps a group's reach but not the documented |v| < 2^22.
    for wrong, wrong_sub in ((0x4B000000, 8388608.0), (0x4B200000, 10485760.0)):
        assert not np.array_equal(biased_to_float(v, wrong, wrong_sub).astype(np.int64), v)
