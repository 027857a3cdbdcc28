"""The CUDA tensor-core GEMMs on ``mma.sync`` / ``wgmma`` tiles (``gemm.cu``,
``gemm_wgmma.cu``): the int32 GEMM and the per-channel W8A8 GEMM, whose launch code also
serves the warp-specialized tiles (:mod:`.gemm_ws`); the ``cuda_int8_gemm`` and
``cuda_w8a8_gemm`` definitions.

The per-channel GEMM multiplies the stored unsigned weight codes directly (``s8 x u8``
tensor-core instructions) with ``- 128 R_m`` and the dequant (+ bias) fused in the
epilogue; for K > ``U8_MAX_K`` the codes are flipped to int8 instead.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from .. import registry
from .kernel import CudaKernel, float_rows, gemm_k, outputs, weight_format
from .launch import FRAME_CACHE, U8_MAX_K, LaunchSpec, _kernel, as_f32, framed, leading_shape
from .quantize import PLAIN, ROWSUM, pack_rowsum, quantize_spec, rowsum_rows_m, rowsum_shape
from .tiles import GemmConfig, WsConfig, grid_blocks, tile_for
from .tma import tma_io, weight_maps


def channel_tail(weight, bias) -> tuple:
    """A per-channel weight's inputs, in the order its bodies take them: codes, float32
    channel scales, float32 bias."""
    tail = (weight.q, weight.channel_scales)
    return tail if bias is None else tail + (as_f32(bias),)


def gemm_per_channel_spec(m: int, k: int, weight, bias, out_dtype: mx.Dtype,
                          config: GemmConfig | WsConfig | None = None,
                          unsigned: bool = False,
                          lead: tuple[int, ...] | None = None) -> LaunchSpec:
    """The launch of :func:`gemm_per_channel` (activations ``xq, xs``) or, when
    ``unsigned``, of :func:`gemm_rowsum` (the activation array ``xa``); outputs
    ``[*lead, N]`` with ``lead``, as :func:`quantize_spec`."""
    # The tile is chosen here, not in the cached frame: it follows is_sm90().
    cfg = config or tile_for(m, weight.n)
    frame = _gemm_per_channel_frame(m, k, weight.n, bias is not None, out_dtype, cfg,
                                    unsigned, leading_shape(m, lead))
    tail = channel_tail(weight, bias)
    if isinstance(cfg, WsConfig) and cfg.tma:  # + the weight's map array
        tail += (weight_maps(weight, cfg.bn),)
    return framed(frame, tail)


@functools.lru_cache(maxsize=FRAME_CACHE)
def _gemm_per_channel_frame(m: int, k: int, n: int, has_bias: bool, out_dtype: mx.Dtype,
                            cfg, unsigned: bool, lead: tuple[int, ...]) -> LaunchSpec:
    """:func:`gemm_per_channel_spec` for any weight of ``n`` rows on tile ``cfg`` (no
    tail: its inputs are all the weight's, :func:`channel_tail`, and with a TMA tile
    its map array, :func:`weight_maps`)."""
    if unsigned:
        if k > U8_MAX_K:
            raise ValueError(f"[mlx_w8a8.cuda_w8a8_gemm] unsigned-code GEMM needs K <= "
                             f"{U8_MAX_K} (exact int32 sums), got {k}")
        names = ("xa", "w", "ws")
        body = "channel_u8"
    elif isinstance(cfg, WsConfig):
        raise ValueError("[mlx_w8a8.cuda_w8a8_gemm_ws] the warp-specialized GEMM multiplies "
                         "unsigned codes only: pass the activation array (K <= "
                         f"{U8_MAX_K}), got codes and scales alone")
    else:
        names = ("xq", "xs", "w", "ws")
        body = "channel"
    if has_bias:
        names += ("bias",)
        body += "_bias"
    if isinstance(cfg, WsConfig):
        body = cfg.body(body)
        if cfg.tma:  # A's map goes into xa, the weight's into its map array (TmaMaps)
            names += ("wmap",)
    grid = grid_blocks(m, n, cfg)
    kern = (cfg.file, body, names, ("y",), cfg.shared_memory)
    return LaunchSpec(kern, (), [("T", out_dtype)] + cfg.template(), [(*lead, n)], [out_dtype],
                      (grid * cfg.threads, 1, 1), (cfg.threads, 1, 1))


def int8_gemm(a: mx.array, b: mx.array, config: GemmConfig | WsConfig | None = None) -> mx.array:
    """``a @ b.T`` for int8 ``a`` ``[M, K]`` and ``b`` ``[N, K]`` as exact int32 ``[M, N]``.

    Args:
        config: a tile of ``GEMM_CONFIGS``, ``WS_CONFIGS`` (the warp-specialized
            kernel) or ``TMA_CONFIGS`` (the same with the TMA producer); ``None``:
            :func:`tile_for`.
    """
    m, k = a.shape
    n = b.shape[0]
    cfg = config or tile_for(m, n)
    grid = grid_blocks(m, n, cfg)
    ws = isinstance(cfg, WsConfig)
    inputs, names, shapes, dtypes, outs = [a, b], ("a", "b"), [(m, n)], [mx.int32], ("c",)
    if ws and cfg.tma:  # + the tensor-map prototypes and the maps' scratch output
        proto, scratch = tma_io(cfg, k, (n,), grid)
        inputs, names, outs = inputs + [proto], names + ("proto",), outs + ("tmap",)
        shapes, dtypes = shapes + [scratch], dtypes + [mx.uint8]
    kern = _kernel(cfg.file, cfg.body("int32") if ws else "int32", names, outs,
                   cfg.shared_memory)
    return kern(
        inputs=inputs, template=cfg.template(), output_shapes=shapes, output_dtypes=dtypes,
        grid=(grid * cfg.threads, 1, 1), threadgroup=(cfg.threads, 1, 1),
    )[0]


def gemm_per_channel(xq, xs, weight, bias, out_dtype,
                     config: GemmConfig | WsConfig | None = None,
                     row_sums: mx.array | None = None):
    """Per-channel W8A8 GEMM on quantized activations (``xq`` int8, ``xs`` f32 [M, 1]).

    With ``row_sums`` (``[M, 1]`` int32, ``quantize(x, row_sum=True)``) the weight codes
    are multiplied unsigned and corrected by ``- 128 * row_sums`` (needs
    ``K <= U8_MAX_K``): :func:`gemm_rowsum` on the three packed into one array
    (:func:`pack_rowsum`; the layers pass :func:`quantize_rowsum`'s array directly);
    without, the codes are flipped to int8 inside the GEMM (not offered by the
    warp-specialized ``WsConfig`` tiles).
    """
    if row_sums is not None:
        return gemm_rowsum(pack_rowsum(xq, xs, row_sums), weight, bias, out_dtype, config)
    m, k = xq.shape
    return gemm_per_channel_spec(m, k, weight, bias, out_dtype, config).launch(xq, xs)[0]


def gemm_rowsum(xa: mx.array, weight, bias, out_dtype, config: GemmConfig | WsConfig | None = None,
                lead: tuple[int, ...] | None = None) -> mx.array:
    """Per-channel W8A8 GEMM on the unsigned weight codes, from one activation array.

    Args:
        xa: ``[R, K]`` int8 from :func:`quantize_rowsum` (or :func:`pack_rowsum`).
        weight: a per-channel ``QuantizedWeight`` ``[N, K]``, ``K <= U8_MAX_K``.
        bias: ``[N]`` or ``None``.
        out_dtype: the output's dtype.
        config: the tile; ``None``: :func:`tile_for`.
        lead: the output's leading shape (``prod(lead) == M``); ``(M,)`` by default.

    Returns:
        ``[*lead, N]`` of ``out_dtype``.

    A TMA tile (``TMA_CONFIGS``) writes its tensor map of the codes into ``xa``'s map
    area (the bytes after the row sums: :func:`rowsum_shape`); nothing else of ``xa``
    changes, and every launch reading the same ``xa`` writes the same bytes there.

    Raises:
        ValueError: where ``xa`` is not such an array for ``weight``'s K.
    """
    r, k = xa.shape if xa.ndim == 2 else (0, 0)
    m = rowsum_rows_m(r, k) if k else 0
    if (xa.dtype != mx.int8 or xa.ndim != 2 or k != weight.k or m < 1
            or rowsum_shape(m, k) != (r, k)):
        raise ValueError(f"[mlx_w8a8.cuda_w8a8_gemm] the activations must be an int8 array "
                         f"of shape rowsum_shape(M, K={weight.k}) (quantize_rowsum), got "
                         f"{xa.dtype} {tuple(xa.shape)}")
    return gemm_per_channel_spec(m, k, weight, bias, out_dtype, config, True,
                                 lead).launch(xa)[0]


# The definitions ------------------------------------------------------------------------
class Int8Gemm(CudaKernel):
    """``cuda_int8_gemm`` (``int8_matmul``): int8 tensor-core GEMM, exact int32 out:
    ``wgmma`` (Hopper, 128 x 256 tile) where the output has enough tiles, ``mma.sync``
    otherwise (:func:`tile_for`)."""

    name = "cuda_int8_gemm"
    op = "int8_matmul"

    def tile(self, p: registry.Problem):
        return tile_for(p.m, p.n)

    def refusals(self, p: registry.Problem):
        if p.dtype != "int8":
            yield f"the operands must be int8, got {p.dtype}"
        if p.m < 1:
            yield f"M must be at least 1, got {p.m}"
        yield outputs(p)
        yield gemm_k(p)

    def variant(self, p: registry.Problem):
        return self.tile(p)

    def run(self, a: mx.array, b: mx.array) -> mx.array:
        p = registry.Problem("int8_matmul", a.shape[0], b.shape[0], a.shape[1], "int8", "int8")
        return int8_gemm(a, b, self.tile(p))


class W8A8Gemm(CudaKernel):
    """``cuda_w8a8_gemm`` (``linear``, per-channel weights): the quantize launch (codes,
    scales and the row sums ``R_m`` in one array) + the GEMM on the unsigned weight
    codes; for K > ``U8_MAX_K`` the plain quantize + the GEMM flipping the codes to int8."""

    name = "cuda_w8a8_gemm"

    def tile(self, p: registry.Problem):
        return tile_for(p.m, p.n)

    def unsigned(self, p: registry.Problem) -> bool:
        """Whether the GEMM multiplies the unsigned codes: its int32 sums are exact only
        for ``K <= U8_MAX_K``."""
        return p.k <= U8_MAX_K

    def refusals(self, p: registry.Problem):
        yield weight_format(p, "per_channel")
        yield outputs(p)
        yield float_rows(p)
        yield gemm_k(p)

    def variant(self, p: registry.Problem):
        return p.dtype, p.has_bias, p.k, self.unsigned(p), self.tile(p)

    def activations(self, p: registry.Problem, lead=None):
        unsigned = self.unsigned(p)
        return (ROWSUM if unsigned else PLAIN,
                quantize_spec(p.m, p.k, getattr(mx, p.dtype), None, unsigned, lead=lead))

    def apply(self, p: registry.Problem, weight, bias, lead=None) -> LaunchSpec:
        return gemm_per_channel_spec(p.m, p.k, weight, bias, getattr(mx, p.dtype), self.tile(p),
                                     self.unsigned(p), lead)
