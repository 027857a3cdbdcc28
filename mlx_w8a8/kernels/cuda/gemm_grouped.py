"""The group-wise W8A8 GEMMs for general affine 8-bit weights: ``mma.sync`` folding each
group's int32 partial sums into float32 (``gemm.cu`` ``grouped``), and the Hopper TMA
GEMM (``gemm_grouped_ws.cu``: the per-channel TMA GEMM's mainloop promoting each group's
exact int32 sum into float32 accumulators after its wgmmas; group size 32, 64 or 128,
``K % 128 == 0``), with its sibling launches; the ``cuda_w8a8_gemm_grouped`` and
``cuda_w8a8_gemm_grouped_tma`` definitions; ``cuda_w4a8_gemm_tma``: the TMA GEMM on
MLX's 4-bit weights as stored, their codes expanded to bytes on chip (exact on an H100);
``cuda_act_groups_gemm_tma``: either code width with one activation scale per token and
group (exact on an H100, not yet timed).

The TMA form is exact on an H200 (``tests/test_cuda.py``) and, measured there, in the
shipped table from M = 128 and in the CUDA prior's rules for M = 32-1023 (``docs/cuda.md``:
2.0-2.5x ``mx.quantized_matmul``, 0.32-0.46x the per-channel TMA GEMM's speed at M = 2048,
where ``cuda_dequant_matmul`` is faster).
"""

from __future__ import annotations

import functools

import mlx.core as mx

from .. import registry
from .kernel import CudaKernel, float_rows, gemm_k, hopper, outputs, tensor_maps, weight_format
from .launch import FRAME_CACHE, MAX_K, SMS, LaunchSpec, as_f32, framed, leading_shape, sibling_bias
from .quantize import (
    grouped_sums_shape,
    quantize_act_groups_spec,
    quantize_groups_spec,
    quantize_spec,
)
from .tiles import (
    GROUPED_TMA_GROUP_SIZES,
    GROUPED_TMA_K_MULTIPLE,
    GemmConfig,
    GroupedTmaConfig,
    PIPE_RUNS,
    grouped_tile_for,
    grouped_tma_tile_for,
    pipe_runs,
    sub_groups,
    sub_tile_for,
    tiles,
)
from .tma import weight_maps


def gemm_grouped_spec(m: int, weight, bias, out_dtype: mx.Dtype,
                      config: GemmConfig | None = None,
                      lead: tuple[int, ...] | None = None) -> LaunchSpec:
    """The launch of :func:`gemm_grouped` (activations ``xq, xs, xr``)."""
    frame = _gemm_grouped_frame(m, weight.n, bias is not None, weight.scales.dtype,
                                weight.group_size, out_dtype,
                                config or grouped_tile_for(m, weight.n), leading_shape(m, lead))
    tail = (weight.q, weight.scales, weight.group_offsets)
    return framed(frame, tail if bias is None else tail + (as_f32(bias),))


@functools.lru_cache(maxsize=FRAME_CACHE)
def _gemm_grouped_frame(m: int, n: int, has_bias: bool, scales_dtype: mx.Dtype,
                        group_size: int, out_dtype: mx.Dtype, cfg,
                        lead: tuple[int, ...]) -> LaunchSpec:
    """:func:`gemm_grouped_spec` for any weight of this shape and format on tile ``cfg``
    (no tail: its inputs are all the weight's)."""
    if not isinstance(cfg, GemmConfig) or cfg.wgmma:
        raise ValueError("[mlx_w8a8.cuda_w8a8_gemm_grouped] the grouped GEMM has mma.sync "
                         f"tiles only (GEMM_CONFIGS 'grouped*'), got {cfg}")
    names = ("xq", "xs", "xr", "w", "ws", "wo")
    body = "grouped"
    if has_bias:
        names += ("bias",)
        body = "grouped_bias"
    kern = ("gemm.cu", body, names, ("y",), cfg.shared_memory)
    template = [("T", out_dtype), ("ST", scales_dtype), ("GS", group_size)]
    return LaunchSpec(kern, (), template + cfg.template(), [(*lead, n)], [out_dtype],
                      (tiles(m, n, cfg) * cfg.threads, 1, 1), (cfg.threads, 1, 1))


def grouped_terms(weight, bn: int) -> mx.array:
    """The group-wise TMA GEMM's per-group terms of ``weight`` on tiles ``bn`` wide:
    float32 ``[ceil(N / bn), G, bn, 2]`` (flat), element ``[t, g, c]`` the pair
    ``(s, o)`` of row ``n = t bn + c`` and group ``g`` (``s`` the stored scale in float32,
    ``o = b + 128 s``: :attr:`QuantizedWeight.group_offsets`; for 4-bit codes the stored
    bias ``b``, their codes being unsigned as stored), zeros for ``n >= N``. One
    k-tile's groups for one tile column are then contiguous: the kernel copies them into
    shared memory with one bulk copy per stage. Made once per weight and tile width and
    kept with the weight (:meth:`QuantizedWeight.derived`), in MLX ops like
    :attr:`QuantizedWeight.group_offsets` (lazy: nothing is read on the host, also under
    ``mx.compile``; :meth:`LaunchSpec.bound` evaluates it where it can)."""
    def make():
        offsets = (weight.biases.astype(mx.float32) if weight.bits == 4
                   else weight.group_offsets)
        t = mx.stack([weight.scales.astype(mx.float32), offsets], axis=-1)
        n, g = weight.n, weight.k // weight.group_size
        tiles_n = -(-n // bn)
        if tiles_n * bn > n:
            t = mx.concatenate([t, mx.zeros((tiles_n * bn - n, g, 2), dtype=mx.float32)])
        return t.reshape(tiles_n, bn, g, 2).transpose(0, 2, 1, 3).reshape(-1)
    return weight.derived(("cuda_grouped_terms", bn), make)


def subnormal_terms(weight, bn: int) -> mx.array:
    """The subnormal promotion's terms of ``weight`` (bfloat16 scales and biases) on tiles
    ``bn`` wide: float32, flat, three sections (``gemm_grouped_ws.cu``, the subnormal
    promotion; ``docs/numerics.md``), with ``E_n = 252 - e_n`` for ``e_n`` the biased
    exponent of row ``n``'s largest ``|s|`` (clipped to 1 .. 229):

    - ``S``: ``[tiles][G][bn]`` bfloat16 (two to a float32 of the flat array),
      ``s_ng 2^E_n``, exactly: a bfloat16 times a power of two, a normal float32 from
      ``2^-110`` (the smallest bfloat16 times ``2^23``) to below ``2^126``;
    - the pieces: ``[tiles][blocks][bn x 16]`` bfloat16 pairs in ``wgmma_desc_plain``'s
      layout, one k16 step per block of ``GB`` groups (:func:`~.tiles.sub_groups`):
      columns ``2 i``, ``2 i + 1`` the group's ``128 b'`` and ``b'`` with
      ``b' = b 2^(E_n - 149)`` (exact: a power of two times a bfloat16), columns
      ``2 GB .. 2 GB + 2`` the block's constant ``-128 sum_g s_g Q_g 2^(E_n - 149)``
      (``Q_g`` the group's code sum; float32, in three bfloat16 pieces), the rest 0;
    - the column scales: ``[tiles][bn]``, ``2^(149 - E_n)``.

    Zeros past N. Made once per weight and tile width and kept with it, in MLX ops
    (lazy, as :func:`grouped_terms`).

    Raises:
        ValueError: for scales or biases that are not bfloat16 (the pieces hold ``b``
            exactly only in bfloat16).
    """
    if weight.scales.dtype != mx.bfloat16 or weight.biases.dtype != mx.bfloat16:
        raise ValueError("[mlx_w8a8.cuda_w8a8_gemm_subnormal] the offset pieces need "
                         "bfloat16 scales and biases, got "
                         f"{weight.scales.dtype} / {weight.biases.dtype}")

    def pow2(e):  # 2^e as float32 from its bits, e in [-126, 127]
        return ((e + 127).astype(mx.uint32) << 23).view(mx.float32)

    def bf16_pieces(v):  # three bfloat16 terms summing to float32 v (to 2^-24 |v|)
        hi = v.astype(mx.bfloat16)
        r = v - hi.astype(mx.float32)
        mid = r.astype(mx.bfloat16)
        lo = (r - mid.astype(mx.float32)).astype(mx.bfloat16)
        return [hi, mid, lo]

    def make():
        n, gs = weight.n, weight.group_size
        g = weight.k // gs
        gb = sub_groups(gs)
        blocks = -(-g // gb)
        tiles_n = -(-n // bn)
        pad = tiles_n * bn - n
        s = weight.scales.astype(mx.float32)
        b = weight.biases.astype(mx.float32)
        smax = mx.max(mx.abs(s), axis=1, keepdims=True)
        e = mx.clip(((smax.view(mx.uint32) >> 23) & 0xFF).astype(mx.int32), 1, 229)
        big = 252 - e  # E_n: 23 .. 251, applied in two factors of at most 2^126
        s_e = s * pow2(big // 2) * pow2(big - big // 2)
        down = pow2(103 - e)  # 2^(E_n - 149)
        b_e = b * down
        q = weight.codes().astype(mx.float32).reshape(n, g, gs).sum(axis=-1)  # Q_g, exact
        c = -128.0 * (s * q) * down  # each exact in float32
        extra = blocks * gb - g
        if extra:
            zeros = mx.zeros((n, extra), dtype=mx.float32)
            b_e, c = mx.concatenate([b_e, zeros], 1), mx.concatenate([c, zeros], 1)
        const = c.reshape(n, blocks, gb).sum(axis=-1)  # [N, blocks]
        cols = [mx.stack([128.0 * b_e, b_e], axis=-1).reshape(n, blocks, 2 * gb)]
        cols += [p.astype(mx.float32)[..., None] for p in bf16_pieces(const)]
        cols.append(mx.zeros((n, blocks, 16 - 2 * gb - 3), dtype=mx.float32))
        pieces = mx.concatenate(cols, axis=-1).astype(mx.bfloat16)  # [N, blocks, 16]
        scale = pow2(e - 103)[:, 0]
        if pad:
            s_e = mx.concatenate([s_e, mx.zeros((pad, g), dtype=mx.float32)])
            pieces = mx.concatenate([pieces, mx.zeros((pad, blocks, 16), dtype=mx.bfloat16)])
            scale = mx.concatenate([scale, mx.zeros((pad,), dtype=mx.float32)])
        s_sec = (s_e.reshape(tiles_n, bn, g).transpose(0, 2, 1).reshape(-1)
                 .astype(mx.bfloat16).view(mx.float32))
        p_sec = (pieces.reshape(tiles_n, bn, blocks, 16).transpose(0, 2, 1, 3)
                 .reshape(tiles_n, blocks, bn // 8, 8, 2, 8).transpose(0, 1, 2, 4, 3, 5)
                 .reshape(-1).view(mx.float32))
        return mx.concatenate([s_sec, p_sec, scale])
    return weight.derived(("cuda_subnormal_terms", bn), make)


def _body(cfg: GroupedTmaConfig, act_groups: bool) -> str:
    """The stem of the group-wise TMA GEMM's bodies: ``tma_grouped`` for 8-bit codes and
    per-token scales without MMA order or the rows-past-M skip (the bodies the shipped
    table measured), ``tma_subnormal`` for the subnormal promotion (``cfg.sub``; code
    width as a template argument), else ``tma_groupwise`` (code width, activation
    scaling, MMA order and the skip as template arguments: :func:`_template`)."""
    if cfg.sub:
        return "tma_subnormal"
    plain = cfg.bits == 8 and not act_groups and not cfg.order and not cfg.live and not cfg.pipe
    return "tma_grouped" if plain else "tma_groupwise"


def _template(cfg: GroupedTmaConfig, act_groups: bool, group_size: int,
              out_dtype: mx.Dtype) -> list:
    """The template arguments of the group-wise TMA GEMM's launch (:func:`_body`)."""
    template = [("T", out_dtype), ("GS", group_size)] + cfg.template()
    if cfg.sub:
        template += [("WB", cfg.bits), ("GB", sub_groups(group_size))]
    elif _body(cfg, act_groups) == "tma_groupwise":
        template += [("WB", cfg.bits), ("AG", act_groups), ("ORD", cfg.order),
                     ("LIVE", cfg.live), ("PIPE", cfg.pipe)]
    return template


def gemm_grouped_tma_spec(m: int, k: int, weight, bias, out_dtype: mx.Dtype,
                          config: GroupedTmaConfig | None = None,
                          lead: tuple[int, ...] | None = None,
                          act_groups: bool = False) -> LaunchSpec:
    """The launch of :func:`gemm_grouped_tma` (activations ``xq, xs, xr``); outputs
    ``[*lead, N]`` with ``lead``, as :func:`quantize_spec`. ``act_groups``: ``xs`` holds
    one scale per row and group (:func:`quantize_act_groups_spec`).

    Raises:
        ValueError: for M < 1, a per-channel weight, a group size other than 32, 64 or
            128, K not a multiple of 128 (or not the weight's, or not below 2^17), or a
            tile not of ``GROUPED_TMA_CONFIGS``' kind (``GROUPED4_TMA_CONFIGS``' for a
            4-bit weight), or a pipelined-promotion run the tile cannot take
            (``GroupedTmaConfig.pipe``: not in ``PIPE_RUNS``, not dividing
            ``K / group_size``, or with ``order``).
    """
    cfg = _grouped_tma_checked(m, k, weight,
                               config or grouped_tma_tile_for(m, weight.n, weight.bits, k,
                                                             weight.group_size))
    frame = _gemm_grouped_tma_frame(m, k, weight.n, bias is not None, weight.group_size,
                                    out_dtype, cfg, leading_shape(m, lead), act_groups)
    tail = (weight.q, _terms(weight, cfg))
    if bias is not None:
        tail += (as_f32(bias),)
    return framed(frame, tail + (weight_maps(weight, cfg.bn),))


def _terms(weight, cfg: GroupedTmaConfig) -> mx.array:
    """The terms array tile ``cfg`` reads: :func:`subnormal_terms` or :func:`grouped_terms`."""
    return subnormal_terms(weight, cfg.bn) if cfg.sub else grouped_terms(weight, cfg.bn)


def _grouped_tma_checked(m: int, k: int, weight, cfg) -> GroupedTmaConfig:
    """``cfg``, once ``weight`` on ``M x K`` activations is a launch of the group-wise TMA
    GEMM on it (:func:`gemm_grouped_tma_spec`'s Raises)."""
    op = "[mlx_w8a8.cuda_w8a8_gemm_grouped_tma]"
    if weight.per_channel or weight.group_size not in GROUPED_TMA_GROUP_SIZES:
        raise ValueError(f"{op} needs a grouped weight with group size in "
                         f"{GROUPED_TMA_GROUP_SIZES}, got per_channel={weight.per_channel}, "
                         f"group_size={weight.group_size}")
    if m < 1:
        raise ValueError(f"{op} M must be at least 1, got {m}")
    if k != weight.k or k % GROUPED_TMA_K_MULTIPLE or not 0 < k < MAX_K:
        raise ValueError(f"{op} K must be the weight's ({weight.k}), a multiple of "
                         f"{GROUPED_TMA_K_MULTIPLE} and below {MAX_K}, got {k}")
    if not isinstance(cfg, GroupedTmaConfig) or cfg.bits != weight.bits:
        raise ValueError(f"{op} the tile must be a GroupedTmaConfig of the weight's "
                         f"{weight.bits}-bit codes (GROUPED_TMA_CONFIGS, "
                         f"GROUPED4_TMA_CONFIGS), got {cfg}")
    if cfg.sub and (cfg.order or cfg.live or cfg.pipe):
        raise ValueError(f"{op} the subnormal promotion (sub) comes without order, live and "
                         f"pipe, got {cfg}")
    if cfg.pipe and (cfg.order or cfg.pipe not in pipe_runs(cfg, k, weight.group_size)):
        raise ValueError(f"{op} pipe must be one of {PIPE_RUNS.get(cfg.bn, ())} for a "
                         f"{cfg.bn}-wide tile, divide K / group_size = "
                         f"{k // weight.group_size} and come without order, got "
                         f"pipe={cfg.pipe}, order={cfg.order}")
    return cfg


@functools.lru_cache(maxsize=FRAME_CACHE)
def _gemm_grouped_tma_frame(m: int, k: int, n: int, has_bias: bool, group_size: int,
                            out_dtype: mx.Dtype, cfg: GroupedTmaConfig,
                            lead: tuple[int, ...], act_groups: bool = False) -> LaunchSpec:
    """:func:`gemm_grouped_tma_spec` for any weight of this shape and group size on tile
    ``cfg`` (no tail: its inputs are the weight's codes, :func:`grouped_terms`, the
    float32 bias and :func:`weight_maps`)."""
    names = ("xq", "xs", "xr", "w", "wt")
    body = _body(cfg, act_groups)
    if has_bias:
        names += ("bias",)
        body += "_bias"
    names += ("wmap",)  # A's map goes into xr's map area, the weight's into wmap
    blocks = min(tiles(m, n, cfg), SMS)
    kern = (cfg.file, body, names, ("y",), cfg.shared_memory(group_size))
    template = _template(cfg, act_groups, group_size, out_dtype)
    return LaunchSpec(kern, (), template, [(*lead, n)], [out_dtype],
                      (blocks * cfg.threads, 1, 1), (cfg.threads, 1, 1))


def gemm_grouped_tma(xq, xs, xr, weight, bias, out_dtype,
                     config: GroupedTmaConfig | None = None,
                     act_groups: bool = False) -> mx.array:
    """Group-wise W8A8 GEMM on Hopper (``gemm_grouped_ws.cu``).

    Args:
        xq: ``[..., K]`` int8 codes (uint8 ``a + 128`` for a ``sub`` tile), ``xs``
            ``[..., 1]`` float32 scales and ``xr`` the group sums in a
            :func:`grouped_sums_shape` array: :func:`quantize_groups`.
        weight: a grouped ``QuantizedWeight`` ``[N, K]`` (group size 32, 64 or 128,
            ``K % 128 == 0``).
        bias: ``[N]`` or ``None``.
        out_dtype: the output's dtype.
        config: the tile; ``None``: :func:`grouped_tma_tile_for`.
        act_groups: ``xs`` is ``[..., K / group_size]``, one scale per row and group
            (:func:`quantize_act_groups`: activation groups).

    Returns:
        ``[..., N]`` of ``out_dtype``.

    The kernel writes its tensor map of ``xq`` into ``xr``'s last 256 bytes; nothing
    else of ``xr`` changes, and every launch reading the same arrays writes the same bytes.

    Raises:
        ValueError: where ``xr`` is not such an array (a ``[M, G]`` array from
            :func:`quantize` has no room for the map), or as :func:`gemm_grouped_tma_spec`.
    """
    k = xq.shape[-1]
    m = xq.size // k
    codes = mx.uint8 if config is not None and config.sub else mx.int8
    if xq.dtype != codes:
        raise ValueError(f"[mlx_w8a8.cuda_w8a8_gemm_grouped_tma] the tile {config} reads "
                         f"{codes} codes (quantize_groups(u8={codes == mx.uint8})), got "
                         f"{xq.dtype}")
    want = grouped_sums_shape(m, k, weight.group_size)
    if xr.dtype != mx.int32 or tuple(xr.shape) != want:
        raise ValueError(f"[mlx_w8a8.cuda_w8a8_gemm_grouped_tma] the group sums must be an "
                         f"int32 array of shape {want} (quantize_groups), got {xr.dtype} "
                         f"{tuple(xr.shape)}")
    return gemm_grouped_tma_spec(m, k, weight, bias, out_dtype, config,
                                 tuple(xq.shape[:-1]), act_groups).launch(xq, xs, xr)[0]


def gemm_grouped_tma_group_spec(m: int, k: int, members, out_dtype: mx.Dtype,
                                config: GroupedTmaConfig | None = None,
                                lead: tuple[int, ...] | None = None,
                                act_groups: bool = False) -> LaunchSpec:
    """One group-wise TMA launch computing several grouped linears of the same
    quantized activations (``xq, xs, xr`` of :func:`quantize_groups`): sibling
    projections (q/k/v, gate/up).

    Args:
        members: 2 or 3 ``(weight, bias)`` pairs (grouped ``QuantizedWeight`` ``[N_g, K]``
            of one group size; bias ``[N_g]`` or ``None``, all or none of them set).
        config: the tile; ``None``: :func:`grouped_tma_tile_for` on the summed N.

    Returns:
        The spec; its launch returns one ``[*lead, N_g]`` output per member, in order,
        each equal bit for bit to the member's own :func:`gemm_grouped_tma_spec` launch
        (a group's float32 sum does not depend on the tile).

    Raises:
        ValueError: for fewer than 2 or more than ``MAX_SIBLINGS`` members, a bias on
            some members only, members of another K or group size, or as
            :func:`gemm_grouped_tma_spec`.
    """
    op = "[mlx_w8a8.cuda_w8a8_gemm_grouped_tma]"
    members = list(members)
    has_bias = sibling_bias(op, members)
    first = members[0][0]
    for w, _ in members:
        if (w.per_channel or w.k != k or w.group_size != first.group_size
                or w.bits != first.bits):
            raise ValueError(f"{op} sibling weights must be grouped with K = {k}, one "
                             f"group size and one code width, got per_channel="
                             f"{w.per_channel}, K={w.k}, group_size={w.group_size}, "
                             f"bits={w.bits} (first: {first.group_size}, {first.bits})")
    ns = tuple(w.n for w, _ in members)
    cfg = config or grouped_tma_tile_for(m, sum(ns), first.bits, k, first.group_size)
    for w, _ in members:  # each member alone must be a valid launch (K, group size, tile)
        _grouped_tma_checked(m, k, w, cfg)
    frame = _gemm_grouped_tma_group_frame(m, k, ns, has_bias, first.group_size,
                                          out_dtype, cfg, leading_shape(m, lead), act_groups)
    tail = []
    for w, b in members:
        tail += [w.q, _terms(w, cfg)] + ([] if b is None else [as_f32(b)])
    tail += [weight_maps(w, cfg.bn) for w, _ in members]
    return framed(frame, tuple(tail))


@functools.lru_cache(maxsize=FRAME_CACHE)
def _gemm_grouped_tma_group_frame(m: int, k: int, ns: tuple[int, ...], has_bias: bool,
                                  group_size: int, out_dtype: mx.Dtype, cfg: GroupedTmaConfig,
                                  lead: tuple[int, ...], act_groups: bool = False) -> LaunchSpec:
    """:func:`gemm_grouped_tma_group_spec` for any members of ``ns`` rows (no tail: the
    members' codes, terms and float32 biases, then their map arrays)."""
    names = ["xq", "xs", "xr"]
    for g in range(len(ns)):
        names += [f"w{g}", f"wt{g}"] + ([f"bias{g}"] if has_bias else [])
    names += [f"wmap{g}" for g in range(len(ns))]
    body = f"{_body(cfg, act_groups)}_group{len(ns)}" + ("_bias" if has_bias else "")
    outs = tuple(f"y{g}" for g in range(len(ns)))
    blocks = min(-(-m // cfg.bm) * sum(-(-n // cfg.bn) for n in ns), SMS)
    kern = (cfg.file, body, tuple(names), outs, cfg.shared_memory(group_size))
    template = _template(cfg, act_groups, group_size, out_dtype)
    return LaunchSpec(kern, (), template, [(*lead, n) for n in ns], [out_dtype] * len(ns),
                      (blocks * cfg.threads, 1, 1), (cfg.threads, 1, 1))


def gemm_grouped(xq, xs, xr, weight, bias, out_dtype, config: GemmConfig | None = None):
    """Grouped W8A8 GEMM (``xr`` the ``[M, K // group_size]`` int32 row sums)."""
    return gemm_grouped_spec(xq.shape[0], weight, bias, out_dtype, config).launch(xq, xs, xr)[0]


# The definitions ------------------------------------------------------------------------
class W8A8GemmGrouped(CudaKernel):
    """``cuda_w8a8_gemm_grouped`` (``linear``, grouped affine weights): the quantize
    launch with per-group row sums + the ``mma.sync`` GEMM folding each group's int32
    partial sums into float32."""

    name = "cuda_w8a8_gemm_grouped"
    formats = ("grouped",)  # the weight formats it multiplies

    def tile(self, p: registry.Problem):
        return grouped_tile_for(p.m, p.n)

    def refusals(self, p: registry.Problem):
        yield weight_format(p, *self.formats)
        yield outputs(p)
        yield float_rows(p)
        yield gemm_k(p)

    def variant(self, p: registry.Problem):
        return p.dtype, p.has_bias, p.group_size, self.tile(p)

    def activations(self, p: registry.Problem, lead=None):
        return (("cuda_per_token", "sums", p.group_size),
                quantize_spec(p.m, p.k, getattr(mx, p.dtype), p.group_size, lead=lead))

    def apply(self, p: registry.Problem, weight, bias, lead=None) -> LaunchSpec:
        return gemm_grouped_spec(p.m, weight, bias, getattr(mx, p.dtype), self.tile(p), lead)


class W8A8GemmGroupedTma(W8A8GemmGrouped):
    """``cuda_w8a8_gemm_grouped_tma`` (``linear``, grouped affine weights, group size 32,
    64 or 128, ``K % 128 == 0``; Hopper with tensor maps): the quantize's per-group sums
    in an array with room for a tensor map + the TMA GEMM of ``gemm_grouped_ws.cu``;
    sibling layers fed the same ``x`` run as one launch of its multi-weight bodies. The
    scales' dtype is not part of the variant: the kernel reads float32 terms
    (:func:`grouped_terms`)."""

    name = "cuda_w8a8_gemm_grouped_tma"
    needs = ("cuda_sm90", "cuda_tma")

    def tile(self, p: registry.Problem):  # the code width by the weight's format
        return grouped_tma_tile_for(p.m, p.n, p.bits, p.k, p.group_size)

    def refusals(self, p: registry.Problem):
        yield from super().refusals(p)
        if p.group_size not in GROUPED_TMA_GROUP_SIZES:
            yield f"the group size must be one of {GROUPED_TMA_GROUP_SIZES}, got {p.group_size}"
        if p.k % GROUPED_TMA_K_MULTIPLE:
            yield (f"K must be a multiple of {GROUPED_TMA_K_MULTIPLE} (whole groups per "
                   f"k-tile), got {p.k}")
        yield hopper()  # before tensor_maps: the driver is probed only on a Hopper GPU
        yield tensor_maps()

    def activations(self, p: registry.Problem, lead=None):
        return (("cuda_per_token", "sums_map", p.group_size),
                quantize_groups_spec(p.m, p.k, getattr(mx, p.dtype), p.group_size, lead))

    def apply(self, p: registry.Problem, weight, bias, lead=None) -> LaunchSpec:
        return gemm_grouped_tma_spec(p.m, p.k, weight, bias, getattr(mx, p.dtype), self.tile(p),
                                     lead)

    def apply_group(self, p: registry.Problem, members, lead=None):
        return (gemm_grouped_tma_group_spec(p.m, p.k, members, getattr(mx, p.dtype),
                                            self.tile(p), lead),)


class W4A8GemmTma(W8A8GemmGroupedTma):
    """``cuda_w4a8_gemm_tma`` (``linear``, MLX's 4-bit affine weights as stored, group
    size 32, 64 or 128, ``K % 128 == 0``; Hopper with tensor maps): the group-wise TMA
    GEMM with the packed codes expanded to bytes on chip by its producer warpgroup
    (``gemm_grouped_ws.cu``, 4-bit weights), the W4A8 math of ``docs/numerics.md``; the
    activations are the group-wise TMA GEMM's (one quantize launch serves both)."""

    name = "cuda_w4a8_gemm_tma"
    formats = ("grouped4",)


class ActGroupsTma(W8A8GemmGroupedTma):
    """``cuda_act_groups_gemm_tma`` (``linear`` with ``act_scales="group"``: one
    activation scale per token and weight group; group-wise 8-bit or MLX's 4-bit weights,
    group size 32, 64 or 128, ``K % 128 == 0``; Hopper with tensor maps): the quantize's
    ``groups`` body (codes, ``[M, G]`` scales, group sums) + the group-wise TMA GEMM with
    each group's term weighed by its activation scale (``tma_groupwise*``, ``AG``), the
    math of ``docs/numerics.md``, "Activation groups"."""

    name = "cuda_act_groups_gemm_tma"
    formats = ("grouped", "grouped4")
    act_scales = ("group",)

    def activations(self, p: registry.Problem, lead=None):
        return (("cuda_act_groups", p.group_size),
                quantize_act_groups_spec(p.m, p.k, getattr(mx, p.dtype), p.group_size, lead))

    def apply(self, p: registry.Problem, weight, bias, lead=None) -> LaunchSpec:
        return gemm_grouped_tma_spec(p.m, p.k, weight, bias, getattr(mx, p.dtype), self.tile(p),
                                     lead, act_groups=True)

    def apply_group(self, p: registry.Problem, members, lead=None):
        return (gemm_grouped_tma_group_spec(p.m, p.k, members, getattr(mx, p.dtype),
                                            self.tile(p), lead, act_groups=True),)


class W8A8GemmSubnormal(W8A8GemmGroupedTma):
    """``cuda_w8a8_gemm_subnormal`` (``linear``, grouped affine 8-bit weights with
    bfloat16 scales and biases, group size 32, 64 or 128, ``K % 128 == 0``; Hopper with
    tensor maps): the group-wise TMA GEMM with the subnormal promotion
    (``gemm_grouped_ws.cu``, bodies ``tma_subnormal*``): the quantize's codes as
    ``a + 128`` (``sums_u8``), u8 x u8 wgmmas, each group's non-negative int32 sum read
    as a float32 subnormal and promoted by one FMA, the offset term on bfloat16 wgmmas
    (:func:`subnormal_terms`); its own error bound (``docs/numerics.md``, the subnormal
    promotion). A weight whose scales are not bfloat16 runs the epilogue form's kernel on
    the same activations instead (:class:`SignedCodes`)."""

    name = "cuda_w8a8_gemm_subnormal"
    bound_form = "subnormal"

    def tile(self, p: registry.Problem):
        return sub_tile_for(p.m, p.n, p.bits)

    def refusals(self, p: registry.Problem):
        yield from super().refusals(p)
        if p.dtype != "bfloat16":
            yield ("bfloat16 activations only (the bfloat16 checkpoints, whose biases its "
                   "bfloat16 offset pieces hold exactly; others run the group-wise TMA GEMM), "
                   f"got {p.dtype}")

    def activations(self, p: registry.Problem, lead=None):
        return (("cuda_per_token", "sums_map_u8", p.group_size),
                quantize_groups_spec(p.m, p.k, getattr(mx, p.dtype), p.group_size, lead, u8=True))

    def apply(self, p: registry.Problem, weight, bias, lead=None) -> LaunchSpec:
        dtype = getattr(mx, p.dtype)
        if subnormal_ready(weight):
            return gemm_grouped_tma_spec(p.m, p.k, weight, bias, dtype, self.tile(p), lead)
        spec = gemm_grouped_tma_spec(p.m, p.k, weight, bias, dtype, None, lead)
        return spec._replace(kernel=SignedCodes(spec.kernel))

    def apply_group(self, p: registry.Problem, members, lead=None):
        dtype = getattr(mx, p.dtype)
        if all(subnormal_ready(w) for w, _ in members):
            return (gemm_grouped_tma_group_spec(p.m, p.k, members, dtype, self.tile(p), lead),)
        spec = gemm_grouped_tma_group_spec(p.m, p.k, members, dtype, None, lead)
        return (spec._replace(kernel=SignedCodes(spec.kernel)),)


def subnormal_ready(weight) -> bool:
    """Whether :func:`subnormal_terms` holds ``weight`` exactly: bfloat16 scales and
    biases."""
    return weight.scales.dtype == mx.bfloat16 and weight.biases.dtype == mx.bfloat16


class SignedCodes:
    """A kernel object taking the subnormal quantize's codes ``a + 128`` (uint8) where the
    kernel it wraps reads ``a`` (int8): the first input flipped back (``^ 0x80``, one
    elementwise op) before the launch. How the subnormal candidates run a weight whose
    scales are not bfloat16 (its pieces could not hold the biases exactly): the group-wise
    TMA GEMM of the epilogue form on the same activations, within that form's tighter
    bound."""

    __slots__ = ("kernel",)

    def __init__(self, kernel):
        self.kernel = kernel

    def __call__(self, inputs, **kwargs):
        codes = (inputs[0] ^ 0x80).view(mx.int8)
        return self.kernel(inputs=[codes, *inputs[1:]], **kwargs)


class W4A8GemmSubnormal(W8A8GemmSubnormal):
    """``cuda_w4a8_gemm_subnormal``: :class:`W8A8GemmSubnormal` on MLX's 4-bit weights as
    stored (the codes expanded on chip as ``cuda_w4a8_gemm_tma``'s)."""

    name = "cuda_w4a8_gemm_subnormal"
    formats = ("grouped4",)
