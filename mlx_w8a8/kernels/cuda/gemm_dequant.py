"""The dequantizing GEMM (``gemm_dequant.cu``): MLX's affine 8-bit and 4-bit weights as
stored, dequantized on chip into bfloat16 / float16 wgmma operands and multiplied by the
float activations as they are (no activation quantization). The ``cuda_dequant_gemm``
definition.
"""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np

from ...weight import dtype_name
from .. import registry, tensormap
from .kernel import CudaKernel, hopper, outputs, tensor_maps, weight_format
from .launch import SMS, LaunchSpec, _kernel, as_f32, leading_shape
from .tiles import DEQUANT_K_MULTIPLE, DequantConfig, dequant_tile_for, tiles

DEQUANT_DTYPES = ("bfloat16", "float16")

DEQUANT_GROUP_SIZES = (32, 64, 128)


def dequant_refusals(p: registry.Problem, formats: tuple[str, ...]):
    """The requirements both dequantizing kernels share (``CudaKernel.refusals``): a
    group-wise format of ``formats``, N >= 1, a 16-bit float activation of at least one
    row, a group size of :data:`DEQUANT_GROUP_SIZES`."""
    yield weight_format(p, *formats)
    yield outputs(p)
    if p.dtype not in DEQUANT_DTYPES:
        yield f"the activation dtype must be one of {DEQUANT_DTYPES}, got {p.dtype}"
    if p.m < 1:
        yield f"M must be at least 1, got {p.m}"
    if p.group_size not in DEQUANT_GROUP_SIZES:
        yield f"the group size must be one of {DEQUANT_GROUP_SIZES}, got {p.group_size}"


def dequant_terms(weight, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
    """The weight's scales and biases in ``dtype`` (the activation's): the stored arrays
    where they already are, else a copy rounded to ``dtype`` once and kept with the
    weight (``QuantizedWeight.derived``)."""
    if weight.scales.dtype == dtype and weight.biases.dtype == dtype:
        return weight.scales, weight.biases
    return weight.derived(("dequant_terms", str(dtype)),
                          lambda: (weight.scales.astype(dtype), weight.biases.astype(dtype)))


@functools.lru_cache(maxsize=1024)
def dequant_prototypes(k: int, n: int, bits: int, bn: int) -> mx.array:
    """The ``proto`` input (uint8 ``[256]``): the activations' map (``[bn, 2k]`` bytes,
    placeholder rows the kernel replaces with M, boxes of ``bn`` rows x 128 bytes, the
    128-byte swizzle), then the codes' (``[n, k bits / 8]`` bytes in boxes of 128 rows x
    64 or 32 bytes, the swizzle of that span: ``gemm_dequant.cu``'s ``dq_wswz``).
    Independent of M."""
    row = k * bits // 8
    raw = (tensormap.prototype(bn, 2 * k, bn)
           + tensormap.prototype(n, row, DequantConfig.bm, 8 * bits, 8 * bits))
    return mx.array(np.frombuffer(raw, dtype=np.uint8))


def gemm_dequant_spec(m: int, k: int, weight, bias, dtype: mx.Dtype,
                      config: DequantConfig | None = None,
                      lead: tuple[int, ...] | None = None) -> LaunchSpec:
    """The dequantizing GEMM's launch for ``x`` ``[M, K]`` (or ``[*lead, K]``) of
    ``dtype`` (bfloat16 or float16).

    Args:
        weight: a group-wise ``QuantizedWeight`` ``[N, K]`` (8-bit or 4-bit codes, group
            size 32, 64 or 128, ``K % 64 == 0``).
        bias: ``[N]`` or ``None``.
        config: the tile; ``None``: :func:`dequant_tile_for`.

    Returns:
        The spec; its launch on ``x`` returns ``[*lead, N]`` of ``dtype`` (then the
        blocks' tensor maps, a scratch output).

    Raises:
        ValueError: for another dtype, K or group size, naming the kernel.
    """
    op = "[mlx_w8a8.cuda_dequant_gemm]"
    name = dtype_name(dtype)
    if name not in DEQUANT_DTYPES:
        raise ValueError(f"{op} the activation dtype must be one of {DEQUANT_DTYPES}, "
                         f"got {name}")
    if k != weight.k or k % DEQUANT_K_MULTIPLE:
        raise ValueError(f"{op} K must be the weight's ({weight.k}) and a multiple of "
                         f"{DEQUANT_K_MULTIPLE}, got {k}")
    if weight.group_size not in DEQUANT_GROUP_SIZES:
        raise ValueError(f"{op} the group size must be one of {DEQUANT_GROUP_SIZES}, got "
                         f"{weight.group_size}")
    cfg = config or dequant_tile_for(m, weight.n)
    lead = leading_shape(m, lead)
    n = weight.n
    ws, wb = dequant_terms(weight, dtype)
    names = ("x", "w", "ws", "wb", "proto")
    tail = [weight.q, ws, wb, dequant_prototypes(k, n, weight.bits, cfg.bn)]
    body = "dequant"
    if bias is not None:
        names += ("bias",)
        tail.append(as_f32(bias))
        body += "_bias"
    kern = _kernel(cfg.file, body, names, ("y", "scratch"), cfg.shared_memory(weight.bits))
    # tiles() counts M / bm x N / bn; this tile is 128 features x bn tokens.
    blocks = min(tiles(n, m, cfg), SMS)
    # Each block's two maps in its slot, + 128 bytes to align the first (tma.cuh).
    scratch = (2 * blocks + 1) * tensormap.MAP_BYTES
    template = [("T", dtype), ("BITS", weight.bits), ("GS", weight.group_size),
                *cfg.template()]
    return LaunchSpec(kern, tuple(tail), template, [(*lead, n), (scratch,)],
                      [dtype, mx.uint8], (blocks * cfg.threads, 1, 1), (cfg.threads, 1, 1))


def gemm_dequant(x: mx.array, weight, bias=None, config: DequantConfig | None = None) -> mx.array:
    """``x @ dequantize(weight).T (+ bias)`` on the dequantizing GEMM.

    Args:
        x: ``[..., K]`` bfloat16 or float16.
        weight: a group-wise ``QuantizedWeight`` ``[N, K]`` (:func:`gemm_dequant_spec`).
        bias: ``[N]`` or ``None``.
        config: the tile; ``None``: :func:`dequant_tile_for`.

    Returns:
        ``[..., N]`` of ``x.dtype``.
    """
    k = x.shape[-1]
    m = x.size // k
    return gemm_dequant_spec(m, k, weight, bias, x.dtype, config,
                             tuple(x.shape[:-1])).launch(x)[0]


class DequantGemm(CudaKernel):
    """``cuda_dequant_gemm`` (``linear``, MLX's group-wise affine 8-bit or 4-bit weights
    as stored, group size 32, 64 or 128, ``K % 64 == 0``, bfloat16 or float16
    activations; Hopper with tensor maps): one launch, both operands brought by TMA, the
    weights dequantized on chip into the wgmma's register operand and multiplied by ``x``
    as it is, in float32 (``gemm_dequant.cu``). Not W8A8: the product
    ``mx.quantized_matmul`` computes, at the tensor cores' 16-bit rate; no copy of the
    weight."""

    name = "cuda_dequant_gemm"
    needs = ("cuda_sm90", "cuda_tma")
    # Not the W8A8 math (registry.Candidate.w8a8): the tuner's gate holds it to the
    # user-facing tolerance against mx.quantized_matmul, as mlx_qmm.
    w8a8 = False
    formats = ("grouped", "grouped4")

    def tile(self, p: registry.Problem) -> DequantConfig:
        return dequant_tile_for(p.m, p.n)

    def refusals(self, p: registry.Problem):
        yield from dequant_refusals(p, self.formats)
        if p.k < 1 or p.k % DEQUANT_K_MULTIPLE:
            yield f"K must be a positive multiple of {DEQUANT_K_MULTIPLE}, got {p.k}"
        yield hopper()
        yield tensor_maps()

    def variant(self, p: registry.Problem):
        return p.dtype, p.has_bias, p.weight_format, p.group_size, self.tile(p)

    def activations(self, p: registry.Problem, lead=None):
        return None, None

    def apply(self, p: registry.Problem, weight, bias, lead=None) -> LaunchSpec:
        return gemm_dequant_spec(p.m, p.k, weight, bias, getattr(mx, p.dtype), self.tile(p),
                                 lead)
