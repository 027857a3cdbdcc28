"""The warp-specialized persistent GEMMs (``gemm_ws.cu``: a producer feeding an mbarrier
ring, two consumer warpgroups on ``wgmma``, epilogue through shared memory), with a
cp.async producer (``cuda_*_ws``) or a TMA producer (``cuda_*_tma``: one thread issuing
tile loads from tensor maps made on the device), and their sibling launches (q/k/v,
gate/up as one launch of the multi-weight bodies). Hopper only; the TMA forms where the
CUDA driver can encode tensor maps (``tensormap.unavailable()`` says why not).
"""

from __future__ import annotations

import functools

import mlx.core as mx

from .. import registry
from .gemm import Int8Gemm, W8A8Gemm, channel_tail, int8_gemm
from .kernel import hopper, tensor_maps
from .launch import FRAME_CACHE, SMS, U8_MAX_K, LaunchSpec, framed, leading_shape, sibling_bias
from .tiles import WsConfig, tma_tile_for, ws_tile_for
from .tma import weight_maps


def gemm_ws_group_spec(m: int, k: int, members, out_dtype: mx.Dtype,
                       config: WsConfig | None = None,
                       lead: tuple[int, ...] | None = None) -> LaunchSpec:
    """One warp-specialized launch computing several per-channel linears of the same
    quantized activations (the array ``xa`` of :func:`quantize_rowsum`; unsigned codes,
    ``K <= U8_MAX_K``).

    Args:
        members: 2 or 3 ``(weight, bias)`` pairs (``QuantizedWeight`` per-channel,
            ``[N_g, K]``; bias ``[N_g]`` or ``None``, all or none of them set).
        config: the tile; ``None``: :func:`ws_tile_for` on the summed N.

    Returns:
        The spec; its launch returns one ``[*lead, N_g]`` output per member, in order.
    """
    op = "[mlx_w8a8.cuda_w8a8_gemm_ws]"
    members = list(members)
    has_bias = sibling_bias(op, members)
    if k > U8_MAX_K:
        raise ValueError(f"{op} unsigned-code GEMM needs K <= {U8_MAX_K} (exact int32 "
                         f"sums), got {k}")
    for w, _ in members:
        if not w.per_channel or w.k != k:
            raise ValueError(f"{op} sibling weights must be per-channel with K = {k}, "
                             f"got format={w.format}, K={w.k}")
    ns = tuple(w.n for w, _ in members)
    cfg = config or ws_tile_for(m, sum(ns))
    frame = _gemm_ws_group_frame(m, k, ns, has_bias, out_dtype, cfg, leading_shape(m, lead))
    tail = tuple(a for w, b in members for a in channel_tail(w, b))
    if cfg.tma:  # + each member's map array
        tail += tuple(weight_maps(w, cfg.bn) for w, _ in members)
    return framed(frame, tail)


@functools.lru_cache(maxsize=FRAME_CACHE)
def _gemm_ws_group_frame(m: int, k: int, ns: tuple[int, ...], has_bias: bool,
                         out_dtype: mx.Dtype, cfg, lead: tuple[int, ...]) -> LaunchSpec:
    """:func:`gemm_ws_group_spec` for any members of ``ns`` rows on tile ``cfg`` (no
    tail: its inputs are the members', :func:`channel_tail` each, and with a TMA tile
    their map arrays, :func:`weight_maps`)."""
    names = ["xa"]
    for g in range(len(ns)):
        names += [f"w{g}", f"ws{g}"]
        if has_bias:
            names.append(f"bias{g}")
    body = cfg.body(f"group{len(ns)}" + ("_bias" if has_bias else ""))
    outs = tuple(f"y{g}" for g in range(len(ns)))
    blocks = min(-(-m // cfg.bm) * sum(-(-n // cfg.bn) for n in ns), SMS)
    shapes, dtypes = [(*lead, n) for n in ns], [out_dtype] * len(ns)
    if cfg.tma:  # A's map goes into xa, each member's into its map array (TmaMaps)
        names += [f"wmap{g}" for g in range(len(ns))]
    kern = (cfg.file, body, tuple(names), outs, cfg.shared_memory)
    return LaunchSpec(kern, (), [("T", out_dtype)] + cfg.template(), shapes, dtypes,
                      (blocks * cfg.threads, 1, 1), (cfg.threads, 1, 1))


def int8_gemm_ws(a: mx.array, b: mx.array, config: WsConfig | None = None) -> mx.array:
    """:func:`int8_gemm` on the warp-specialized kernel (``config`` or :func:`ws_tile_for`)."""
    return int8_gemm(a, b, config or ws_tile_for(a.shape[0], b.shape[0]))


def int8_gemm_tma(a: mx.array, b: mx.array, config: WsConfig | None = None) -> mx.array:
    """:func:`int8_gemm` on the warp-specialized kernel with the TMA producer (``config``
    or :func:`tma_tile_for`)."""
    return int8_gemm(a, b, config or tma_tile_for(a.shape[0], b.shape[0], a.shape[1]))


# The definitions ------------------------------------------------------------------------
class Int8GemmWs(Int8Gemm):
    """``cuda_int8_gemm_ws`` (``int8_matmul``, Hopper): the warp-specialized GEMM on
    :func:`ws_tile_for`'s tile."""

    name = "cuda_int8_gemm_ws"
    needs = ("cuda_sm90",)

    def tile(self, p: registry.Problem):
        return ws_tile_for(p.m, p.n)

    def refusals(self, p: registry.Problem):
        yield from super().refusals(p)
        yield hopper()


class Int8GemmTma(Int8GemmWs):
    """``cuda_int8_gemm_tma`` (``int8_matmul``, Hopper with tensor maps): the
    warp-specialized GEMM with the TMA producer on :func:`tma_tile_for`'s tile."""

    name = "cuda_int8_gemm_tma"
    needs = ("cuda_sm90", "cuda_tma")

    def tile(self, p: registry.Problem):
        return tma_tile_for(p.m, p.n, p.k)

    def refusals(self, p: registry.Problem):
        yield from super().refusals(p)
        yield tensor_maps()


class W8A8GemmWs(W8A8Gemm):
    """``cuda_w8a8_gemm_ws`` (``linear``, per-channel weights, Hopper, ``K <= U8_MAX_K``):
    ``cuda_w8a8_gemm``'s quantize launch (shared with it: one activation format) + the
    warp-specialized GEMM with the same epilogue; sibling layers fed the same ``x`` run
    as one launch of the multi-weight bodies."""

    name = "cuda_w8a8_gemm_ws"
    needs = ("cuda_sm90",)

    def tile(self, p: registry.Problem):
        return ws_tile_for(p.m, p.n)

    def unsigned(self, p: registry.Problem) -> bool:
        return True  # refusals: K <= U8_MAX_K

    def refusals(self, p: registry.Problem):
        yield from super().refusals(p)
        if p.k > U8_MAX_K:
            yield (f"multiplies unsigned weight codes only, exact for K <= {U8_MAX_K}, "
                   f"got K = {p.k} (cuda_w8a8_gemm flips the codes there)")
        yield hopper()

    def variant(self, p: registry.Problem):
        return p.dtype, p.has_bias, p.k, self.tile(p)

    def apply_group(self, p: registry.Problem, members, lead=None):
        return (gemm_ws_group_spec(p.m, p.k, members, getattr(mx, p.dtype), self.tile(p), lead),)


class W8A8GemmTma(W8A8GemmWs):
    """``cuda_w8a8_gemm_tma`` (``linear``, per-channel weights, Hopper with tensor maps):
    ``cuda_w8a8_gemm_ws`` with the TMA producer on :func:`tma_tile_for`'s tile, sibling
    launches included."""

    name = "cuda_w8a8_gemm_tma"
    needs = ("cuda_sm90", "cuda_tma")

    def tile(self, p: registry.Problem):
        return tma_tile_for(p.m, p.n, p.k)

    def refusals(self, p: registry.Problem):
        yield from super().refusals(p)
        yield tensor_maps()
