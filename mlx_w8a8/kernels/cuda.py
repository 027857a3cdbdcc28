"""CUDA candidates: the launchers of :mod:`.cuda_launch` registered with the tuner.

Registered candidates (offered only when ``mx.cuda.is_available()`` and the default
device is the GPU; importing this module never needs CUDA):

- ``cuda_quantize`` (``quantize_activation``): per-token int8 codes, float32 scales and
  optional per-group row sums, one block per row.
- ``cuda_int8_gemm`` (``int8_matmul``): int8 tensor-core GEMM, int32 out: ``wgmma``
  (Hopper, 128 x 256 tile) where the output has enough tiles, ``mma.sync`` otherwise.
- ``cuda_int8_gemm_ws`` (``int8_matmul``, Hopper only): the warp-specialized persistent
  GEMM (``gemm_ws.cu``: a producer warp feeding an mbarrier ring, two consumer
  warpgroups keeping one wgmma group in flight, epilogue through shared memory).
- ``cuda_w8a8_gemm`` (``linear``, per-channel weights): quantize (codes, scales and the
  row sums R_m) + GEMM multiplying the stored unsigned weight codes directly
  (``s8 x u8`` tensor-core instructions) with ``- 128 R_m`` and the dequant (+ bias)
  fused in the epilogue; for K > ``U8_MAX_K`` the codes are flipped to int8 instead.
- ``cuda_w8a8_gemm_ws`` (``linear``, per-channel weights, Hopper, K <= ``U8_MAX_K``):
  ``cuda_w8a8_gemm``'s quantize + the warp-specialized GEMM with the same epilogue. It
  also computes sibling layers fed the same ``x`` (q/k/v, gate/up: ``bind_group``,
  :mod:`mlx_w8a8.siblings`) in one launch of the multi-weight bodies.
- ``cuda_int8_gemm_tma`` / ``cuda_w8a8_gemm_tma`` (Hopper, where the CUDA driver can
  encode tensor maps: ``tensormap.unavailable()`` says why not): the warp-specialized
  GEMMs above with a TMA producer (one thread issuing tile loads from tensor maps made on
  the device, ``shaders/cuda/tma.cuh``) instead of cp.async copies; the same epilogue,
  sibling launches included.
- ``cuda_w8a8_gemm_grouped`` (``linear``, grouped affine weights): quantize with row sums
  + GEMM folding each group's int32 partial sums into float32.
- ``cuda_w8a8_gemm_grouped_tma`` (``linear``, grouped affine weights, group size 32, 64
  or 128, ``K % 128 == 0``; Hopper with tensor maps, as ``cuda_w8a8_gemm_tma``): the
  quantize's per-group sums + the TMA GEMM's mainloop (``gemm_grouped_ws.cu``) promoting
  each group's exact int32 sum into float32 accumulators after its wgmmas. Compiled
  for sm_90a in CI; not yet run on a GPU, and in no tuning table or prior: offered to
  the tuner, which races it. Sibling layers fed the same ``x`` (``bind_group``) run as
  one launch of its multi-weight bodies.
- ``cuda_int8_gemv`` (``linear``, M <= 16, either format): a memory-bound dp4a kernel
  over the stored codes; one launch (each block quantizes x into shared memory) when
  ``M x K`` fits, else quantize + GEMV. Sibling layers (``bind_group``) run as one
  launch of the fused kernel where it applies.

Every linear candidate whose activation quantization is a launch of its own offers
``stages`` (``registry.Candidate``) so layers fed the same ``x`` quantize it once; the
activation formats (``act_key``) are ``("cuda_per_token", "rowsum")`` (one int8 array
holding the codes, scales and row sums ``R_m``: ``cuda_launch.rowsum_shape``),
``("cuda_per_token", "plain")`` (codes, scales), ``("cuda_per_token", "sums",
group_size)`` and ``("cuda_per_token", "sums_map", group_size)`` (the same codes, scales
and sums, the sums followed by room for a tensor map: ``cuda_launch.grouped_sums_shape``).

Each linear candidate also offers ``bind_stages`` (``registry.Candidate``): the same
launches with everything but the activations computed once per layer, shape and weight
(``cuda_launch.bind_*``), so a layer's call only launches; given the activation's leading
shape they take ``x`` ``[..., K]`` and return ``[..., N]`` (the kernels read any rank:
``shaders/cuda/shape.cuh``), so the layer adds no reshape.

Each candidate also names what it compiles for a problem (``variant``,
``registry.Candidate``: bodies, dtype, tile or GEMV bucket), so that
:func:`mlx_w8a8.warm_up` calls a layer once per kernel MLX would compile for it.

Measured on an NVIDIA H200 (``docs/cuda.md``); the tuner, not this module, decides where
each candidate runs.
"""

from __future__ import annotations

import mlx.core as mx

from . import cuda_launch as launch
from . import registry, sources, tensormap
from .cuda_launch import (
    FLOAT_DTYPES,
    GROUPED_TMA_GROUP_SIZES,
    GROUPED_TMA_K_MULTIPLE,
    GEMM_K_MULTIPLE,
    GEMV_MAX_M,
    MAX_K,
    QUANT_K_MULTIPLE,
    U8_MAX_K,
    bind_gemm_grouped,
    bind_gemm_grouped_tma,
    bind_gemm_grouped_tma_group,
    bind_gemm_per_channel,
    bind_gemm_ws_group,
    bind_gemv_fused,
    bind_gemv_fused_group,
    bind_gemv_quantized,
    bind_quantize,
    bind_quantize_groups,
    cuda_available,
    gemm_grouped,
    gemm_grouped_tma,
    gemm_per_channel,
    gemm_rowsum,
    gemv,
    gemv_fuses,
    gemv_quantized,
    grouped_tma_tile_for,
    int8_gemm,
    int8_gemm_tma,
    int8_gemm_ws,
    is_sm90,
    quantize,
    quantize_groups,
    quantize_rowsum,
    rowsum_rows_m,
    tma_tile_for,
    ws_tile_for,
)

ROWSUM = ("cuda_per_token", "rowsum")
PLAIN = ("cuda_per_token", "plain")


# Two-stage forms (registry.Candidate.stages) and the run functions built from them ----
def _quantize_rowsum(x):
    return (quantize_rowsum(x),)  # one array: codes, scales and row sums


def _quantize_plain(x):
    return quantize(x)


def _apply_u8(acts, weight, bias, out_dtype):
    return gemm_rowsum(acts[0], weight, bias, out_dtype)


def _apply_flip(acts, weight, bias, out_dtype):
    xq, xs, _ = acts
    return gemm_per_channel(xq, xs, weight, bias, out_dtype)


def _apply_ws(acts, weight, bias, out_dtype):
    xa = acts[0]
    return gemm_rowsum(xa, weight, bias, out_dtype, ws_tile_for(rowsum_rows_m(*xa.shape), weight.n))


def _apply_tma(acts, weight, bias, out_dtype):
    xa = acts[0]
    m, k = rowsum_rows_m(*xa.shape), xa.shape[1]
    return gemm_rowsum(xa, weight, bias, out_dtype, tma_tile_for(m, weight.n, k))


def _apply_grouped(acts, weight, bias, out_dtype):
    xq, xs, xr = acts
    return gemm_grouped(xq, xs, xr, weight, bias, out_dtype)


def _apply_grouped_tma(acts, weight, bias, out_dtype):
    xq, xs, xr = acts
    return gemm_grouped_tma(xq, xs, xr, weight, bias, out_dtype)


def _apply_gemv(acts, weight, bias, out_dtype):
    xq, xs, _ = acts
    return gemv_quantized(xq, xs, weight, bias, out_dtype)


def _w8a8_gemm_stages(p: registry.Problem):
    if p.k <= U8_MAX_K:  # unsigned codes, exact int32 (see U8_MAX_K)
        return ROWSUM, _quantize_rowsum, _apply_u8
    return PLAIN, _quantize_plain, _apply_flip


def _w8a8_ws_stages(p: registry.Problem):
    # The same quantize launch as cuda_w8a8_gemm's unsigned path: the two share it.
    # (rowsum_warp writes the same bits but measured no faster on an H200: docs/cuda.md.)
    return ROWSUM, _quantize_rowsum, _apply_ws


def _w8a8_tma_stages(p: registry.Problem):
    return ROWSUM, _quantize_rowsum, _apply_tma  # the ws candidate's quantize, shared


def _w8a8_grouped_stages(p: registry.Problem):
    gs = p.group_size

    def quantize_groups(x):
        return quantize(x, gs)

    return ("cuda_per_token", "sums", gs), quantize_groups, _apply_grouped


def _sums_map_key(p: registry.Problem):
    return ("cuda_per_token", "sums_map", p.group_size)


def _w8a8_grouped_tma_stages(p: registry.Problem):
    gs = p.group_size

    def quantize_for_tma(x):
        return quantize_groups(x, gs)

    return _sums_map_key(p), quantize_for_tma, _apply_grouped_tma


def _gemv_stages(p: registry.Problem):
    if gemv_fuses(p.m, p.k):
        return None  # one launch: x is quantized inside the GEMV
    return PLAIN, _quantize_plain, _apply_gemv


def _quantize_run(x, group_size):
    return quantize(x, group_size)


def _w8a8_gemm_run(x, weight, bias):
    if x.shape[1] <= U8_MAX_K:
        return _apply_u8(_quantize_rowsum(x), weight, bias, x.dtype)
    return _apply_flip(_quantize_plain(x), weight, bias, x.dtype)


def _w8a8_ws_run(x, weight, bias):
    return _apply_ws(_quantize_rowsum(x), weight, bias, x.dtype)


def _w8a8_tma_run(x, weight, bias):
    return _apply_tma(_quantize_rowsum(x), weight, bias, x.dtype)


def _w8a8_grouped_run(x, weight, bias):
    xq, xs, xr = quantize(x, weight.group_size)
    return gemm_grouped(xq, xs, xr, weight, bias, x.dtype)


def _w8a8_grouped_tma_run(x, weight, bias):
    return _apply_grouped_tma(quantize_groups(x, weight.group_size), weight, bias, x.dtype)


def _gemv_run(x, weight, bias):
    return gemv(x, weight, bias)


# Bound forms (registry.Candidate.bind_stages): the launches of the stages above for one
# problem and weight, everything but the activations computed here once -----------------
def _w8a8_gemm_bind(p: registry.Problem, weight, bias, lead=None):
    dtype = getattr(mx, p.dtype)
    unsigned = p.k <= U8_MAX_K  # as _w8a8_gemm_stages and _w8a8_gemm_run
    return (ROWSUM if unsigned else PLAIN,
            bind_quantize(p.m, p.k, dtype, row_sum=unsigned, lead=lead),
            bind_gemm_per_channel(p.m, p.k, weight, bias, dtype, unsigned=unsigned, lead=lead))


def _w8a8_ws_bind(p: registry.Problem, weight, bias, lead=None):
    dtype = getattr(mx, p.dtype)
    return (ROWSUM, bind_quantize(p.m, p.k, dtype, row_sum=True, lead=lead),
            bind_gemm_per_channel(p.m, p.k, weight, bias, dtype, ws_tile_for(p.m, weight.n),
                                  unsigned=True, lead=lead))


def _w8a8_ws_bind_group(p: registry.Problem, members, lead=None):
    # p: the siblings' summed problem (N = sum of N_g); the quantize is _w8a8_ws_bind's.
    dtype = getattr(mx, p.dtype)
    return (ROWSUM, bind_quantize(p.m, p.k, dtype, row_sum=True, lead=lead),
            bind_gemm_ws_group(p.m, p.k, members, dtype, lead=lead))


def _w8a8_tma_bind(p: registry.Problem, weight, bias, lead=None):
    dtype = getattr(mx, p.dtype)
    return (ROWSUM, bind_quantize(p.m, p.k, dtype, row_sum=True, lead=lead),
            bind_gemm_per_channel(p.m, p.k, weight, bias, dtype, tma_tile_for(p.m, weight.n, p.k),
                                  unsigned=True, lead=lead))


def _w8a8_tma_bind_group(p: registry.Problem, members, lead=None):
    dtype = getattr(mx, p.dtype)
    return (ROWSUM, bind_quantize(p.m, p.k, dtype, row_sum=True, lead=lead),
            bind_gemm_ws_group(p.m, p.k, members, dtype, tma_tile_for(p.m, p.n, p.k), lead=lead))


def _w8a8_grouped_bind(p: registry.Problem, weight, bias, lead=None):
    dtype = getattr(mx, p.dtype)
    gs = p.group_size  # as _w8a8_grouped_stages
    return (("cuda_per_token", "sums", gs), bind_quantize(p.m, p.k, dtype, gs, lead=lead),
            bind_gemm_grouped(p.m, weight, bias, dtype, lead=lead))


def _w8a8_grouped_tma_bind(p: registry.Problem, weight, bias, lead=None):
    dtype = getattr(mx, p.dtype)
    return (_sums_map_key(p), bind_quantize_groups(p.m, p.k, dtype, p.group_size, lead=lead),
            bind_gemm_grouped_tma(p.m, p.k, weight, bias, dtype, lead=lead))


def _w8a8_grouped_tma_bind_group(p: registry.Problem, members, lead=None):
    # p: the siblings' summed problem; the quantize is _w8a8_grouped_tma_bind's.
    dtype = getattr(mx, p.dtype)
    return (_sums_map_key(p), bind_quantize_groups(p.m, p.k, dtype, p.group_size, lead=lead),
            bind_gemm_grouped_tma_group(p.m, p.k, members, dtype, lead=lead))


def _gemv_bind(p: registry.Problem, weight, bias, lead=None):
    dtype = getattr(mx, p.dtype)
    if gemv_fuses(p.m, p.k):  # one launch, as _gemv_run
        return None, None, bind_gemv_fused(p.m, p.k, weight, bias, dtype, lead)
    return (PLAIN, bind_quantize(p.m, p.k, dtype, lead=lead),
            bind_gemv_quantized(p.m, weight, bias, dtype, lead))


def _gemv_bind_group(p: registry.Problem, members, lead=None):
    # p: the siblings' summed problem. Where x fits the fused kernel's shared memory, one
    # launch for all members; otherwise the shared quantize and each member's own GEMV
    # launch (what the members alone would run, so nothing is lost).
    dtype = getattr(mx, p.dtype)
    if gemv_fuses(p.m, p.k):
        return None, None, bind_gemv_fused_group(p.m, p.k, members, dtype, lead)
    applies = [bind_gemv_quantized(p.m, w, b, dtype, lead) for w, b in members]
    return (PLAIN, bind_quantize(p.m, p.k, dtype, lead=lead),
            lambda acts: [apply(acts) for apply in applies])


# What each candidate compiles for a problem (registry.Candidate.variant) ----------------
# MLX compiles a custom kernel per name and template arguments, on its first evaluation
# in a process. Each key below holds what the launchers above derive those from: the
# bodies (bias or not, unsigned or flipped codes, fused or not), the dtype, the tile or
# GEMV bucket. The per-channel GEMMs' keys also hold K, which their compiled forms do
# not follow beyond the unsigned-code bound and the TMA tile (the quantize's block size
# is a launch parameter): stricter than needed, so warm_up may call a layer where
# nothing new compiles. The weight's scales dtype (the grouped kernels' ST) is fixed for
# a layer and not part of a problem. A sibling launch compiles its multi-weight body for
# the key of the summed problem (the same rules on the summed N).
def _quantize_variant(p: registry.Problem):
    return p.dtype, p.group_size


def _int8_gemm_variant(p: registry.Problem):
    return launch.tile_for(p.m, p.n)


def _int8_ws_variant(p: registry.Problem):
    return ws_tile_for(p.m, p.n)


def _int8_tma_variant(p: registry.Problem):
    return tma_tile_for(p.m, p.n, p.k)


def _w8a8_gemm_variant(p: registry.Problem):
    return p.dtype, p.has_bias, p.k, p.k <= U8_MAX_K, launch.tile_for(p.m, p.n)


def _w8a8_ws_variant(p: registry.Problem):
    return p.dtype, p.has_bias, p.k, ws_tile_for(p.m, p.n)


def _w8a8_tma_variant(p: registry.Problem):
    return p.dtype, p.has_bias, p.k, tma_tile_for(p.m, p.n, p.k)


def _w8a8_grouped_variant(p: registry.Problem):
    return p.dtype, p.has_bias, p.group_size, launch.grouped_tile_for(p.m, p.n)


def _w8a8_grouped_tma_variant(p: registry.Problem):
    # GS and the tile are template arguments; the scales' dtype is not (the kernel reads
    # float32 terms, cuda_launch.grouped_terms).
    return p.dtype, p.has_bias, p.group_size, grouped_tma_tile_for(p.m, p.n)


def _gemv_variant(p: registry.Problem):
    bucket = launch.gemv_bucket(p.m)
    grouped = p.weight_format == "grouped"
    # the fused kernel's template holds its shared-memory size (bucket * K)
    smem = bucket * p.k if gemv_fuses(p.m, p.k) else 0
    return p.dtype, p.has_bias, grouped, p.group_size if grouped else None, bucket, smem




# Capability checks (cheap; no device memory touched) ------------------------------------
def _float_k_ok(p: registry.Problem) -> bool:
    return p.dtype in FLOAT_DTYPES and p.m >= 1 and p.k % GEMM_K_MULTIPLE == 0 and 0 < p.k < MAX_K


def _supports_quantize(p: registry.Problem) -> bool:
    return p.dtype in FLOAT_DTYPES and p.m >= 1 and p.k > 0 and p.k % QUANT_K_MULTIPLE == 0


def _supports_int8(p: registry.Problem) -> bool:
    return (p.dtype == "int8" and p.m >= 1 and p.n >= 1 and p.k % GEMM_K_MULTIPLE == 0
            and 0 < p.k < MAX_K)


def _supports_int8_ws(p: registry.Problem) -> bool:
    return _supports_int8(p) and is_sm90()


def _supports_gemm(p: registry.Problem) -> bool:
    return p.weight_format == "per_channel" and p.n >= 1 and _float_k_ok(p)


def _supports_gemm_ws(p: registry.Problem) -> bool:
    return _supports_gemm(p) and p.k <= U8_MAX_K and is_sm90()


def status() -> dict[str, tuple[bool, str]]:
    """``{"cuda_sm90": (on, reason), "cuda_tma": (on, reason)}`` as a user-facing report:
    whether the Hopper kernels (wgmma, warp-specialized) and their TMA form are offered."""
    if not cuda_available():
        return {"cuda_sm90": (False, "no CUDA GPU is MLX's default device"),
                "cuda_tma": (False, "no CUDA GPU is MLX's default device")}
    if not is_sm90():
        return {"cuda_sm90": (False, "the GPU is not compute capability 9.x (sm_90a)"),
                "cuda_tma": (False, "needs sm_90a")}
    why = tensormap.unavailable()
    return {"cuda_sm90": (True, "compute capability 9.x"),
            "cuda_tma": (why is None, why or "tensor maps encodable (CUDA driver through cffi)")}


# The TMA candidates take what their cp.async twins take, where tensor maps can be
# encoded (the driver is probed once, and only on a Hopper GPU: is_sm90 comes first).
def _supports_int8_tma(p: registry.Problem) -> bool:
    return _supports_int8_ws(p) and tensormap.available()


def _supports_gemm_tma(p: registry.Problem) -> bool:
    return _supports_gemm_ws(p) and tensormap.available()


def _supports_grouped(p: registry.Problem) -> bool:
    return p.weight_format == "grouped" and p.n >= 1 and _float_k_ok(p)


def _supports_grouped_tma(p: registry.Problem) -> bool:
    # is_sm90 before tensormap.available: the driver is probed only on a Hopper GPU.
    return (_supports_grouped(p) and p.group_size in GROUPED_TMA_GROUP_SIZES
            and p.k % GROUPED_TMA_K_MULTIPLE == 0 and is_sm90() and tensormap.available())


def _supports_gemv(p: registry.Problem) -> bool:
    return (p.weight_format in ("per_channel", "grouped") and 1 <= p.m <= GEMV_MAX_M
            and p.n >= 1 and _float_k_ok(p))


# What a CUDA candidate's digest follows (sources.closure_digest): the code of these
# modules that its launchers reach, and the kernel files named in that code.
_DIGEST_MODULES = (__name__, launch.__name__, tensormap.__name__)


def _kernel_texts(file: str) -> list[str]:
    """What MLX compiles of ``file`` (:func:`launch.load`: its header after the headers
    it requires, and its bodies, comments stripped): a comment edited in a kernel file
    leaves tuning tables fresh, any code edit stales them."""
    header, bodies = launch.load(file)
    return [header] + [f"{name}\n{body}" for name, body in sorted(bodies.items())]


def _digest(*entries) -> str:
    return sources.closure_digest(entries, _DIGEST_MODULES, (".cu",), _kernel_texts)


_SM90, _TMA = ("cuda_sm90",), ("cuda_sm90", "cuda_tma")


def _define(name: str, op: str, run, supports, variant, *, stages=None, bind=None, group=None,
            needs: tuple[str, ...] = ()) -> None:
    """Register one CUDA kernel: everything it is, in one call. Its digest is derived
    from ``run``, ``stages``, ``bind`` and ``group`` (:func:`_digest`); ``needs``: the
    capabilities (``status()``) it runs only with; ``group``: its sibling launch
    (``registry.Candidate.bind_group``: q/k/v, gate/up as one launch)."""
    registry.needs(name, *needs)
    registry.register(
        registry.Candidate(name=name, backend="cuda", op=op, run=run, supports=supports,
                           digest=_digest(run, stages, bind, group), available=cuda_available,
                           stages=stages, bind_stages=bind, bind_group=group, variant=variant)
    )


_define("cuda_quantize", "quantize_activation", _quantize_run, _supports_quantize,
        _quantize_variant)
_define("cuda_int8_gemm", "int8_matmul", int8_gemm, _supports_int8, _int8_gemm_variant)
_define("cuda_int8_gemm_ws", "int8_matmul", int8_gemm_ws, _supports_int8_ws, _int8_ws_variant,
        needs=_SM90)
_define("cuda_int8_gemm_tma", "int8_matmul", int8_gemm_tma, _supports_int8_tma,
        _int8_tma_variant, needs=_TMA)
_define("cuda_w8a8_gemm", "linear", _w8a8_gemm_run, _supports_gemm, _w8a8_gemm_variant,
        stages=_w8a8_gemm_stages, bind=_w8a8_gemm_bind)
_define("cuda_w8a8_gemm_ws", "linear", _w8a8_ws_run, _supports_gemm_ws, _w8a8_ws_variant,
        stages=_w8a8_ws_stages, bind=_w8a8_ws_bind, group=_w8a8_ws_bind_group, needs=_SM90)
_define("cuda_w8a8_gemm_tma", "linear", _w8a8_tma_run, _supports_gemm_tma, _w8a8_tma_variant,
        stages=_w8a8_tma_stages, bind=_w8a8_tma_bind, group=_w8a8_tma_bind_group, needs=_TMA)
_define("cuda_w8a8_gemm_grouped", "linear", _w8a8_grouped_run, _supports_grouped,
        _w8a8_grouped_variant, stages=_w8a8_grouped_stages, bind=_w8a8_grouped_bind)
_define("cuda_w8a8_gemm_grouped_tma", "linear", _w8a8_grouped_tma_run, _supports_grouped_tma,
        _w8a8_grouped_tma_variant, stages=_w8a8_grouped_tma_stages,
        bind=_w8a8_grouped_tma_bind, group=_w8a8_grouped_tma_bind_group, needs=_TMA)
_define("cuda_int8_gemv", "linear", _gemv_run, _supports_gemv, _gemv_variant,
        stages=_gemv_stages, bind=_gemv_bind, group=_gemv_bind_group)
