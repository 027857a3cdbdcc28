"""Tensor maps for the TMA GEMMs: the prototypes of A's and the weights' maps, encoded on
the host once (:mod:`mlx_w8a8.kernels.tensormap`), which each launch completes with the
addresses it receives (``shaders/cuda/tma.cuh``)."""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np

from .. import tensormap
from .tiles import WsConfig


@functools.lru_cache(maxsize=1024)
def _tma_prototypes(k: int, ns: tuple[int, ...], bn: int) -> mx.array:
    """The ``proto`` input of the ``tma_int32`` body: A's map (``[BM, k]`` in ``BM``-row boxes;
    the kernel writes each launch's M and ``min(M, BM)`` box rows in: tma.cuh
    tma_replace_rows), then each weight's (``[n, k]``, ``bn``-row boxes), 128 bytes each
    (uint8). Independent of M, so a prompt of a new length encodes no map and copies no
    prototype to the device."""
    return mx.array(np.frombuffer(_prototype_bytes(k, ns, bn), dtype=np.uint8))


def _prototype_bytes(k: int, ns: tuple[int, ...], bn: int) -> bytes:
    """A's tensor-map prototype, then each weight's: :func:`_tma_prototypes`' bytes."""
    maps = [tensormap.prototype(WsConfig.bm, k, WsConfig.bm)]
    maps += [tensormap.prototype(n, k, bn) for n in ns]
    return b"".join(maps)


def tma_io(cfg: WsConfig, k: int, ns: tuple[int, ...], blocks: int):
    """The int32 TMA body's extra input (the prototypes) and its scratch output's shape:
    one slot of 1 + G maps per block, + 128 bytes to align the first (gemm_ws.cu
    TmaMaps)."""
    scratch = ((1 + len(ns)) * blocks + 1) * tensormap.MAP_BYTES
    return _tma_prototypes(k, ns, cfg.bn), (scratch,)


WEIGHT_MAPS_BYTES = 4 * tensormap.MAP_BYTES
PACKED_BOX_K = 64  # a 4-bit weight's box: 64 bytes (128 codes, one k-tile) per row, unswizzled


def weight_maps(weight, bn: int) -> mx.array:
    """``[512]`` uint8, the per-channel TMA GEMM's map array for ``weight`` on tiles
    ``bn`` wide: A's tensor-map prototype (``[128, K]`` codes), then the weight's
    (``[N, K]`` in ``bn``-row boxes), then 256 bytes where every launch writes the
    weight's map made from the address it receives (gemm_ws.cu TmaMaps). Made once per
    weight and tile width and kept with the weight (:meth:`QuantizedWeight.derived`; for a
    4-bit weight the second map reads its packed codes, ``[N, K / 2]`` bytes in boxes of
    ``bn`` rows x :data:`PACKED_BOX_K` bytes, unswizzled): an
    input of every launch on it, where a scratch output would cost each launch about
    2.7 us of host time (docs/cuda.md "Host time per launch"). Every launch on the
    weight writes the same bytes there, also launches that run at once, so a launch
    reads only the map it made itself (tma.cuh)."""
    def make():  # made on the host whole: no graph to evaluate, also under mx.compile
        if weight.bits == 4:  # the packed codes, [N, K / 2] bytes (gemm_grouped_ws.cu)
            protos = (tensormap.prototype(WsConfig.bm, weight.k, WsConfig.bm)
                      + tensormap.prototype(weight.n, weight.k // 2, bn, PACKED_BOX_K, False))
        else:
            protos = _prototype_bytes(weight.k, (weight.n,), bn)
        raw = protos + bytes(WEIGHT_MAPS_BYTES - len(protos))
        return mx.array(np.frombuffer(raw, dtype=np.uint8))
    return weight.derived(("cuda_tma_maps", bn), make)
