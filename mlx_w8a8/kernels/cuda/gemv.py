"""The memory-bound small-M kernels (``gemv.cu``, ``M <= 16``): a dp4a kernel over the
stored codes, one launch (each block quantizes ``x`` into shared memory) where ``M x K``
fits, else the quantize kernel then the GEMV; sibling layers run as one launch of the
fused kernel where it applies. The ``cuda_int8_gemv`` definition (8-bit codes, either
format) and the ``cuda_w4a8_gemv`` one (MLX's 4-bit weights as stored, the codes
expanded to bytes in registers).
"""

from __future__ import annotations

import mlx.core as mx

from .. import registry
from .kernel import CudaKernel, float_rows, gemm_k, outputs, weight_format
from .launch import SMS, LaunchSpec, _kernel, as_f32, leading_shape, sibling_bias
from .quantize import PLAIN, quantize, quantize_spec
from .tiles import WAVE_FILL


GEMV_MAX_M = 16

GEMV_THREADS = 256

# Fused GEMV: x's codes live in shared memory (MM * K bytes); a persistent grid.
GEMV_FUSED_MAX_SMEM = 96 * 1024

GEMV_FUSED_BLOCKS = 132  # one block per SM: the grouped kernels need > 128 registers


def gemv_rows_per_warp(m_bucket: int) -> int:
    """Weight rows per warp: more rows share each activation load, but the accumulators
    (RW x MM) must stay in registers (RW = 4 at MM = 16 spills, per ptxas)."""
    return 4 if m_bucket <= 2 else 2


def gemv_bucket(m: int) -> int:
    """Rows of x a GEMV kernel is compiled for: the next of 1, 2, 4, 8, 16."""
    for b in (1, 2, 4, 8, 16):
        if m <= b:
            return b
    raise ValueError(f"[mlx_w8a8.cuda_int8_gemv] M must be in [1, {GEMV_MAX_M}], got {m}")


def gemv_fuses(m: int, k: int) -> bool:
    """Whether the one-launch GEMV (x quantized into shared memory) takes ``M x K``."""
    return gemv_bucket(m) * k <= GEMV_FUSED_MAX_SMEM


def _gemv_weight(weight, bias, dtype):
    """Weight inputs, their names, the dtype/group template and the body name."""
    if weight.bits == 4:  # the stored arrays: packed codes, scales and biases (one dtype)
        w_inputs = [weight.q, weight.scales, weight.biases]
        w_names = ("w", "ws", "wo")
        template = [("T", dtype), ("ST", weight.scales.dtype), ("GS", weight.group_size)]
        body = "grouped4"
    elif not weight.per_channel:
        w_inputs = [weight.q, weight.scales, weight.group_offsets]
        w_names = ("w", "ws", "wo")
        template = [("T", dtype), ("ST", weight.scales.dtype), ("GS", weight.group_size)]
        body = "grouped"
    else:
        w_inputs = [weight.q, weight.channel_scales]
        w_names = ("w", "ws")
        template = [("T", dtype)]
        body = "channel"
    if bias is not None:
        w_inputs.append(as_f32(bias))
        w_names += ("bias",)
        body += "_bias"
    return w_inputs, w_names, template, body


def check_siblings(op: str, members, k: int) -> None:
    """Raise ``ValueError`` (naming ``op``) unless the sibling ``(weight, bias)`` pairs
    can share one GEMV launch: the biases all set or all ``None`` (``sibling_bias``), and
    every weight of ``K = k`` with the first's format, group size and scales' dtype (a
    grouped launch has one ``ST`` for every ``ws<g>``)."""
    sibling_bias(op, members)
    first = members[0][0]
    for w, _ in members:
        if (w.k != k or w.format != first.format or w.group_size != first.group_size
                or w.scales.dtype != first.scales.dtype):
            raise ValueError(f"{op} sibling weights must share K = {k}, the format, the "
                             f"group size and the scales' dtype, got K={w.k}, "
                             f"format={w.format}, group_size={w.group_size}, "
                             f"scales {w.scales.dtype} (first: {first.format}, "
                             f"group_size={first.group_size}, scales {first.scales.dtype})")


def gemv_fused_spec(m: int, k: int, weight, bias, dtype: mx.Dtype,
                    lead: tuple[int, ...] | None = None) -> LaunchSpec:
    """The one-launch GEMV (activation ``x`` ``[M, K]`` of ``dtype``, ``M <= 16``)."""
    n = weight.n
    lead = leading_shape(m, lead)
    mm = gemv_bucket(m)
    rw = gemv_rows_per_warp(mm)
    w_inputs, w_names, template, body = _gemv_weight(weight, bias, dtype)
    smem = mm * k
    # The shared-memory size is part of the template so each size is its own kernel
    # (MLX raises the function's dynamic shared-memory limit once, at first load).
    kern = _kernel("gemv.cu", "fused_" + body, ("x",) + w_names, ("y",), smem)
    warps = -(-n // rw)
    blocks = min(-(-warps * 32 // GEMV_THREADS), GEMV_FUSED_BLOCKS)
    return LaunchSpec(kern, tuple(w_inputs),
                      template + [("MM", mm), ("RW", rw), ("SMEM_BYTES", smem)],
                      [(*lead, n)], [dtype], (blocks * GEMV_THREADS, 1, 1), (GEMV_THREADS, 1, 1))


def gemv_fused_group_spec(m: int, k: int, members, dtype: mx.Dtype,
                          lead: tuple[int, ...] | None = None) -> LaunchSpec:
    """One fused GEMV launch computing several linears of the same activation ``x``
    (``[M, K]`` of ``dtype``, ``M <= 16``, :func:`gemv_fuses`): sibling projections.

    Args:
        members: 2 or 3 ``(weight, bias)`` pairs (``QuantizedWeight`` ``[N_g, K]``, all
            per-channel or all grouped with one group size; bias ``[N_g]`` or ``None``,
            all or none of them set).

    Returns:
        The spec; its launch returns one ``[*lead, N_g]`` output per member, in order,
        each equal bit for bit to the member's own :func:`gemv_fused_spec` launch.
    """
    op = "[mlx_w8a8.cuda_int8_gemv]"
    members = list(members)
    check_siblings(op, members, k)
    if not gemv_fuses(m, k):
        raise ValueError(f"{op} the sibling launch is the fused kernel: needs "
                         f"bucket(M) * K <= {GEMV_FUSED_MAX_SMEM}, got M={m}, K={k}")
    lead = leading_shape(m, lead)
    mm = gemv_bucket(m)
    rw = gemv_rows_per_warp(mm)
    tail, names, template = [], ["x"], None
    for g, (w, b) in enumerate(members):
        w_inputs, w_names, template, body = _gemv_weight(w, b, dtype)
        tail += w_inputs
        names += [f"{name}{g}" for name in w_names]
    # the member's own body ("channel", "grouped_bias", ...) -> "fused_channel_group2", ...
    base = body.removesuffix("_bias")
    body = f"fused_{base}_group{len(members)}" + body[len(base):]
    ns = [w.n for w, _ in members]
    smem = mm * k
    outs = tuple(f"y{g}" for g in range(len(members)))
    kern = _kernel("gemv.cu", body, tuple(names), outs, smem)
    warps = sum(-(-n // rw) for n in ns)
    blocks = min(-(-warps * 32 // GEMV_THREADS), GEMV_FUSED_BLOCKS)
    return LaunchSpec(kern, tuple(tail),
                      template + [("MM", mm), ("RW", rw), ("SMEM_BYTES", smem)],
                      [(*lead, n) for n in ns], [dtype] * len(ns),
                      (blocks * GEMV_THREADS, 1, 1), (GEMV_THREADS, 1, 1))


def gemv_quantized_spec(m: int, weight, bias, out_dtype: mx.Dtype,
                        lead: tuple[int, ...] | None = None) -> LaunchSpec:
    """The two-launch GEMV's second launch (activations ``xq, xs``, ``M <= 16``)."""
    n = weight.n
    lead = leading_shape(m, lead)
    mm = gemv_bucket(m)
    rw = gemv_rows_per_warp(mm)
    w_inputs, w_names, template, body = _gemv_weight(weight, bias, out_dtype)
    kern = _kernel("gemv.cu", body, ("xq", "xs") + w_names, ("y",))
    return LaunchSpec(kern, tuple(w_inputs), template + [("MM", mm), ("RW", rw)],
                      [(*lead, n)], [out_dtype], (-(-n // rw) * 32, 1, 1), (GEMV_THREADS, 1, 1))


def gemv(x, weight, bias, fused: bool | None = None):
    """Small-M W8A8 (``M <= 16``) for either weight format; ``y`` in ``x.dtype``.

    Args:
        x: ``[M, K]`` float activation.
        weight: a ``QuantizedWeight`` ``[N, K]``.
        bias: ``[N]`` or ``None``.
        fused: one launch (quantize x in each block's shared memory) or two (the
            quantize kernel first); ``None`` fuses when ``gemv_fuses(M, K)``.
    """
    m, k = x.shape
    if fused is None:
        fused = gemv_fuses(m, k)
    if not fused:
        xq, xs, _ = quantize(x)
        return gemv_quantized(xq, xs, weight, bias, x.dtype)
    return gemv_fused_spec(m, k, weight, bias, x.dtype).launch(x)[0]


def gemv_quantized(xq, xs, weight, bias, out_dtype):
    """The two-launch GEMV's second launch: ``xq`` ``[M, K]`` int8 and ``xs`` ``[M, 1]``
    float32 from :func:`quantize` (``M <= 16``); ``y`` ``[M, N]`` in ``out_dtype``."""
    return gemv_quantized_spec(xq.shape[0], weight, bias, out_dtype).launch(xq, xs)[0]


# The definition ---------------------------------------------------------------------------
class Int8Gemv(CudaKernel):
    """``cuda_int8_gemv`` (``linear``, ``M <= 16``, either 8-bit format): one fused launch
    where :func:`gemv_fuses`, else the plain quantize + the GEMV; sibling layers as one
    fused launch, or the shared quantize and each member's own GEMV launch (what the
    members alone would run, so nothing is lost). The variant holds the fused kernel's
    shared-memory size (bucket * K), a template argument."""

    name = "cuda_int8_gemv"
    formats = ("per_channel", "grouped")  # the weight formats it multiplies

    def fuses(self, p: registry.Problem) -> bool:
        return gemv_fuses(p.m, p.k)

    def refusals(self, p: registry.Problem):
        yield weight_format(p, *self.formats)
        if not 1 <= p.m <= GEMV_MAX_M:
            yield f"M must be in [1, {GEMV_MAX_M}], got {p.m}"
        yield outputs(p)
        yield float_rows(p)
        yield gemm_k(p)

    def variant(self, p: registry.Problem):
        bucket = gemv_bucket(p.m)
        grouped = p.weight_format != "per_channel"
        smem = bucket * p.k if self.fuses(p) else 0
        return p.dtype, p.has_bias, grouped, p.group_size if grouped else None, bucket, smem

    def activations(self, p: registry.Problem, lead=None):
        if self.fuses(p):
            return None, None
        return PLAIN, quantize_spec(p.m, p.k, getattr(mx, p.dtype), lead=lead)

    def apply(self, p: registry.Problem, weight, bias, lead=None) -> LaunchSpec:
        dtype = getattr(mx, p.dtype)
        if self.fuses(p):
            return gemv_fused_spec(p.m, p.k, weight, bias, dtype, lead)
        return gemv_quantized_spec(p.m, weight, bias, dtype, lead)

    def apply_group(self, p: registry.Problem, members, lead=None):
        dtype = getattr(mx, p.dtype)
        if self.fuses(p):
            return (gemv_fused_group_spec(p.m, p.k, members, dtype, lead),)
        return tuple(gemv_quantized_spec(p.m, w, b, dtype, lead) for w, b in members)


class W4A8Gemv(Int8Gemv):
    """``cuda_w4a8_gemv`` (``linear``, ``M <= 16``, MLX's 4-bit affine weights as stored,
    group size 32, 64 or 128): ``cuda_int8_gemv``'s launches on the packed codes, each
    lane's 16-byte load (32 codes) expanded to bytes in registers and folded per chunk
    with the group's scale and bias (the W4A8 math of ``docs/numerics.md``); no second
    copy of the weight. The decode kernel the tuner weighs against ``mx.quantized_matmul``
    at 4 bits (qmv)."""

    name = "cuda_w4a8_gemv"
    formats = ("grouped4",)

    def refusals(self, p: registry.Problem):
        yield from super().refusals(p)
        if p.weight_format == "grouped4" and (p.group_size or 0) % 32:
            yield ("the group size must be a multiple of 32 (a lane's 16-byte load, 32 "
                   f"codes, inside one group), got {p.group_size}")


# The tensor-core form (gemv_mma.cu) -------------------------------------------------------
MMA_GEMV_MAX_M = 32
MMA_GEMV_GROUP_SIZES = (64, 128)  # a step of 64 codes inside one group, or a group of two
MMA_GEMV_K_MULTIPLE = 64  # codes per step of a warp


# Warps per block: each block owns 16 RT weight rows and splits K among its warps, whose
# partial sums it adds in warp order (mma_warps: 8, or 2 on launches of many blocks).
MMA_GEMV_WARPS = 8
MMA_GEMV_FEW_WARPS = 2
# Blocks per SM from which group-wise launches take MMA_GEMV_FEW_WARPS a block.
MMA_GEMV_WARP_FILL = 3
# Steps of 64 codes whose loads a lane has in flight (gemv_mma.cu's D: 2 or 4).
MMA_GEMV_DEPTH = 2


def mma_row_tiles(m: int, n: int, bits: int = 8) -> int:
    """Tiles of 16 weight rows a block owns (gemv_mma.cu's RT) for an ``M x N`` launch
    (``N``: a sibling launch's summed rows) on ``bits``-bit codes: 2 for 8-bit codes at
    four token tiles (``M`` = 25-32) where the launch still has ``WAVE_FILL * SMS``
    blocks, else 1.

    Every block reads all of x for its rows, so two tiles a block read it half as often.
    Measured on an NVIDIA H100 (``bench/small_m_gpu_time.py``, CUPTI kernel times, group
    size 64, Llama-3-8B shapes; parts SMD and SMQ of
    ``bench/results/h100_2026-12-07_h.log``): with 8-bit codes at M = 32 two tiles took
    0.81-0.94x one tile's time on the five shapes this picks them for and 1.03x on 6144 x
    4096 (192 blocks), and 1.44x on 1024 x 4096 (32 blocks: it keeps one); with 4-bit
    codes at M = 32 they took 1.11-1.18x one tile's time on five of those six shapes
    (0.96x on 4096 x 14336); at M = 16 and 24 (and 8, 4-bit) one tile was the fastest of
    1, 2 and 4 on every shape within 1.01x, at both widths."""
    if bits == 8 and -(-m // 8) == 4 and -(-n // 32) >= WAVE_FILL * SMS:
        return 2
    return 1


def mma_warps(m: int, n: int, bits: int = 8, per_channel: bool = False,
              rows: int | None = None) -> int:
    """Warps a block (gemv_mma.cu's W) for an ``M x N`` launch (``N``: a sibling launch's
    summed rows) of ``rows`` tiles a block (``None``: :func:`mma_row_tiles`): 2 for
    group-wise codes (8-bit or MLX's 4-bit) where the launch has at least
    ``MMA_GEMV_WARP_FILL * SMS`` blocks, else 8.

    Fewer warps split K among fewer lanes in more, smaller blocks, so more blocks share an
    SM. Measured on NVIDIA H100s (``bench/small_m_gpu_time.py``, CUPTI kernel times, group
    size 64; ``bench/results/h100_2026-12-07_h.log``): with 8-bit codes (part RING2) two
    warps took 0.77-0.91x eight's time on launches of 448-8016 blocks (14336 x 4096 and
    128256 x 4096, N x K, at M = 16 and 32) and 1.68x and 2.26x it on 256 and 128 blocks
    (4096 x 14336); in the 4-layer Llama-3-8B decode from the 8-bit gs64 checkpoint the
    step took 0.92x / 0.93x the eight-warp step's time at B = 16 / 32 (part WRB, the same
    machine). With 4-bit codes (part W4K) two warps took 0.64-0.95x eight's time on the
    four launches of 896-8016 blocks and 1.38-2.23x it on 256 blocks. The partials
    are added in another order, so the last bits of an output follow the count: a sibling
    launch equals its members' own launches bit for bit where they take the same count.
    Per-channel codes keep 8 (not measured with fewer)."""
    blocks = -(-n // (16 * (rows or mma_row_tiles(m, n, bits))))
    if not per_channel and blocks >= MMA_GEMV_WARP_FILL * SMS:
        return MMA_GEMV_FEW_WARPS
    return MMA_GEMV_WARPS


def _mma_row_tiles(op: str, m: int, n: int, bits: int, rows: int | None) -> int:
    """``rows`` (tiles of 16 weight rows a block; ``None``: :func:`mma_row_tiles`),
    checked against what gemv_mma.cu takes."""
    nt = -(-m // 8)
    if rows is None:
        return mma_row_tiles(m, n, bits)
    if rows not in (1, 2, 4) or rows * nt > 8:
        raise ValueError(f"{op} row tiles must be 1, 2 or 4 with row tiles x token tiles "
                         f"<= 8 (token tiles {nt}), got {rows}")
    return rows


def gemv_mma_spec(m: int, weight, bias, out_dtype: mx.Dtype,
                  lead: tuple[int, ...] | None = None, depth: int = MMA_GEMV_DEPTH,
                  rows: int | None = None, warps: int | None = None) -> LaunchSpec:
    """The tensor-core small-M launch on the plain quantize's ``xq, xs`` (``M <= 32``,
    8-bit codes per-channel or in groups, or MLX's 4-bit codes; group size 64 / 128,
    ``K % 64 == 0``); ``depth``: steps of loads in flight a lane (2 or 4); ``rows``:
    tiles of 16 weight rows a block (1, 2 or 4, at most 8 / ceil(M / 8); ``None``:
    :func:`mma_row_tiles`); ``warps``: warps a block, splitting K (2, 4 or 8; ``None``:
    :func:`mma_warps`; the partials' order, so the output's last bits, follow it);
    ``bench/small_m_gpu_time.py`` times the choices."""
    op = "[mlx_w8a8.cuda_int8_gemv_mma]"
    if depth not in (2, 4):
        raise ValueError(f"{op} depth must be 2 or 4, got {depth}")
    n = weight.n
    lead = leading_shape(m, lead)
    nt = -(-m // 8)
    rows = _mma_row_tiles(op, m, n, weight.bits, rows)
    if warps is None:
        warps = mma_warps(m, n, weight.bits, weight.per_channel, rows)
    if warps not in (2, 4, 8):
        raise ValueError(f"{op} warps must be 2, 4 or 8, got {warps}")
    w_inputs, w_names, template, body = _gemv_weight(weight, bias, out_dtype)
    kern = _kernel("gemv_mma.cu", body, ("xq", "xs") + w_names, ("y",))
    return LaunchSpec(kern, tuple(w_inputs),
                      template + [("NT", nt), ("W", warps), ("D", depth), ("RT", rows)],
                      [(*lead, n)], [out_dtype], (-(-n // (16 * rows)) * 32 * warps, 1, 1),
                      (32 * warps, 1, 1))


def gemv_mma_group_spec(m: int, members, out_dtype: mx.Dtype,
                        lead: tuple[int, ...] | None = None,
                        rows: int | None = None) -> LaunchSpec:
    """One launch of the tensor-core small-M GEMV for sibling weights fed the same
    activations (``xq, xs`` of the plain quantize, ``M <= 32``).

    Args:
        members: 2 or 3 ``(weight, bias)`` pairs (``QuantizedWeight`` ``[N_g, K]``, all
            per-channel, or all group-wise of one code width, group size and scale
            dtype; bias ``[N_g]`` or ``None``, all or none of them set).
        rows: tiles of 16 weight rows a block, as for :func:`gemv_mma_spec` (``None``:
            :func:`mma_row_tiles` of the summed rows).

    Returns:
        The spec; its launch returns one ``[*lead, N_g]`` output per member, in order,
        each equal bit for bit to the member's own :func:`gemv_mma_spec` launch where
        both take the same warps a block (:func:`mma_warps` counts the summed rows here,
        the member's own there), else within the same bound.
    """
    op = "[mlx_w8a8.cuda_int8_gemv_mma]"
    members = list(members)
    check_siblings(op, members, members[0][0].k)
    lead = leading_shape(m, lead)
    ns = [w.n for w, _ in members]
    rows = _mma_row_tiles(op, m, sum(ns), members[0][0].bits, rows)
    warps = mma_warps(m, sum(ns), members[0][0].bits, members[0][0].per_channel, rows)
    tail, names, template = [], ["xq", "xs"], None
    for g, (w, b) in enumerate(members):
        w_inputs, w_names, template, body = _gemv_weight(w, b, out_dtype)
        tail += w_inputs
        names += [f"{name}{g}" for name in w_names]
    base = body.removesuffix("_bias")  # "grouped_bias" -> "grouped_group2_bias"
    body = f"{base}_group{len(members)}" + body[len(base):]
    kern = _kernel("gemv_mma.cu", body, tuple(names), tuple(f"y{g}" for g in range(len(ns))))
    blocks = sum(-(-n // (16 * rows)) for n in ns)
    return LaunchSpec(kern, tuple(tail),
                      template + [("NT", -(-m // 8)), ("W", warps), ("D", MMA_GEMV_DEPTH),
                                  ("RT", rows)],
                      [(*lead, n) for n in ns], [out_dtype] * len(ns),
                      (blocks * 32 * warps, 1, 1), (32 * warps, 1, 1))


class Int8GemvMma(CudaKernel):
    """``cuda_int8_gemv_mma`` (``linear``, ``M <= 32``, 8-bit codes per-channel or in
    groups of 64 or 128, ``K % 64 == 0``): the plain quantize, then ``gemv_mma.cu``: the
    weight rows as mma.sync's A operand straight from global memory, 16 rows a block
    (16 RT with ``rows=`` of the specs), the tokens as its n8 columns, K split among the
    block's warps; sibling layers as one launch on the shared quantize. For the batch sizes of batched decode, where the dp4a
    GEMV (``cuda_int8_gemv``) reads each activation chunk once per weight row."""

    name = "cuda_int8_gemv_mma"
    formats = ("per_channel", "grouped")

    def refusals(self, p: registry.Problem):
        yield weight_format(p, *self.formats)
        if not 1 <= p.m <= MMA_GEMV_MAX_M:
            yield f"M must be in [1, {MMA_GEMV_MAX_M}], got {p.m}"
        yield outputs(p)
        yield float_rows(p)
        yield gemm_k(p)
        if p.k % MMA_GEMV_K_MULTIPLE:
            yield f"K must be a multiple of {MMA_GEMV_K_MULTIPLE} (a warp's step), got {p.k}"
        if p.weight_format != "per_channel" and p.group_size not in MMA_GEMV_GROUP_SIZES:
            yield (f"the group size must be one of {MMA_GEMV_GROUP_SIZES} (a step of 64 "
                   f"codes inside one group), got {p.group_size}")

    def variant(self, p: registry.Problem):
        grouped = p.weight_format != "per_channel"
        return (p.dtype, p.has_bias, grouped, p.group_size if grouped else None, -(-p.m // 8),
                mma_row_tiles(p.m, p.n, p.bits),
                mma_warps(p.m, p.n, p.bits, p.weight_format == "per_channel"))

    def activations(self, p: registry.Problem, lead=None):
        return PLAIN, quantize_spec(p.m, p.k, getattr(mx, p.dtype), lead=lead)

    def apply(self, p: registry.Problem, weight, bias, lead=None) -> LaunchSpec:
        return gemv_mma_spec(p.m, weight, bias, getattr(mx, p.dtype), lead)

    def apply_group(self, p: registry.Problem, members, lead=None):
        return (gemv_mma_group_spec(p.m, members, getattr(mx, p.dtype), lead),)


class W4A8GemvMma(Int8GemvMma):
    """``cuda_w4a8_gemv_mma`` (``linear``, ``M <= 32``, MLX's 4-bit affine weights as
    stored, group size 64 or 128, ``K % 64 == 0``): ``cuda_int8_gemv_mma``'s launches on
    the packed codes, each lane's 8 bytes of a step (16 codes) expanded to bytes in
    registers and multiplied unflipped, each group folded with its scale and stored bias
    (the W4A8 math of ``docs/numerics.md``); no second copy of the weight."""

    name = "cuda_w4a8_gemv_mma"
    formats = ("grouped4",)
