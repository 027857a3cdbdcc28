"""Every CUDA kernel body compiles with ``nvcc`` for sm_90a, wrapped as MLX wraps it;
and what the launchers hand to MLX is checked on any machine (no GPU needed).

``mx.fast.cuda_kernel`` compiles at first use, on the user's GPU; a kernel that does not
compile would fail there, not in CI. This test builds each body the launchers can
produce (:func:`kernel_builds`, the manifest below) the way ``mlx/backend/cuda/custom_kernel.cpp`` does:
MLX's default header, the file's header, then inside ``namespace mlx::core::cu`` a
``__global__`` function taking ``const T* <input>`` (plus ``__grid_constant__ Shape
<input>_shape`` when the body mentions it) and ``T* <output>``, the template arguments as
``constexpr`` / ``using`` lines, then the body. MLX's own ``utils.cuh`` is not shipped in
the wheel as a file (it is compiled into libmlx), so a stand-in with the two names the
bodies use (``Shape``, ``Strides``) is written to a temporary include directory.

Skipped, with the reason printed, when ``nvcc`` is not on PATH.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import pytest

from kernel_recorder import fake_tensor_maps, record_launches
from mlx_w8a8.kernels import cuda, registry, sources, tensormap
from mlx_w8a8.kernels.cuda import (
    dequant_matmul as cuda_dequant_matmul,
    gemm as cuda_gemm,
    gemm_grouped as cuda_gemm_grouped,
    gemm_ws as cuda_gemm_ws,
    gemv as cuda_gemv,
    kernel as cuda_kernel,
    launch,
    quantize as cuda_quantize,
    tiles as cuda_tiles,
    tma as cuda_tma,
)

NVCC = shutil.which("nvcc")
ARCH = "-gencode=arch=compute_90a,code=sm_90a"
MAX_NDIM = 10  # mlx/backend/cuda/device/config.h

# dtype name -> the type custom_kernel.cpp writes (dtype_to_cuda_type).
CUDA_TYPES = {
    "bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
    "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t",
    "uint64": "uint64_t", "float16": "__half", "bfloat16": "__nv_bfloat16",
    "float32": "float", "float64": "double",
}

STAND_IN_UTILS = f"""#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cuda/std/limits>
#include <cuda/std/tuple>
namespace mlx::core::cu {{
using Shape = cuda::std::array<int32_t, {MAX_NDIM}>;
using Strides = cuda::std::array<int64_t, {MAX_NDIM}>;
}}
"""

DEFAULT_HEADER = """
#include "mlx/backend/cuda/device/utils.cuh"

#include <cooperative_groups.h>

"""


# The manifest: every body with the template arguments the launchers use -----------------
class KernelBuild(NamedTuple):
    """One kernel as MLX would compile it: file, body, typed inputs/outputs, template."""

    file: str
    body: str
    inputs: tuple[tuple[str, str, int], ...]  # (name, dtype name, ndim)
    outputs: tuple[tuple[str, str], ...]  # (name, dtype name)
    template: tuple[tuple[str, object], ...]  # values: int, bool or a dtype name


def _channel_inputs(body: str) -> tuple[tuple[str, str, int], ...]:
    # the unsigned-code bodies take one activation array (cuda_quantize.rowsum_shape)
    ins = (("xa", "int8", 2),) if "_u8" in body else (("xq", "int8", 2), ("xs", "float32", 2))
    ins += (("w", "uint32", 2), ("ws", "float32", 1))
    if body.endswith("bias"):
        ins += (("bias", "float32", 1),)
    return ins


def _group_members(body: str) -> int:
    return int(body.removeprefix("tma_")[len("group")])


def _group_inputs(body: str) -> tuple[tuple[str, str, int], ...]:
    ins = (("xa", "int8", 2),)
    for g in range(_group_members(body)):
        ins += ((f"w{g}", "uint32", 2), (f"ws{g}", "float32", 1))
        if body.endswith("bias"):
            ins += ((f"bias{g}", "float32", 1),)
    return ins


def _group_outputs(body: str, t: str) -> tuple[tuple[str, str], ...]:
    return tuple((f"y{g}", t) for g in range(_group_members(body)))


def _grouped_tma_inputs(body: str) -> tuple[tuple[str, str, int], ...]:
    # codes, scales, the group sums with A's map area (cuda_quantize.grouped_sums_shape), the
    # weight codes, its terms (cuda_gemm_grouped.grouped_terms), bias, its map array (weight_maps)
    ins = (("xq", "int8", 2), ("xs", "float32", 2), ("xr", "int32", 1), ("w", "uint32", 2),
           ("wt", "float32", 1))
    if body.endswith("bias"):
        ins += (("bias", "float32", 1),)
    return ins + (("wmap", "uint8", 1),)


def _grouped_tma_group_inputs(body: str, members: int) -> tuple[tuple[str, str, int], ...]:
    # as _grouped_tma_inputs per member (codes, terms, bias), then each member's map array
    ins = (("xq", "int8", 2), ("xs", "float32", 2), ("xr", "int32", 1))
    for g in range(members):
        ins += ((f"w{g}", "uint32", 2), (f"wt{g}", "float32", 1))
        if body.endswith("bias"):
            ins += ((f"bias{g}", "float32", 1),)
    return ins + tuple((f"wmap{g}", "uint8", 1) for g in range(members))


def kernel_builds() -> list[KernelBuild]:
    """Every (body, template) combination the launchers can produce, one per tile config
    / group size / row bucket, with representative dtypes."""
    out = []
    for t in launch.FLOAT_DTYPES:
        out.append(KernelBuild("quantize.cu", "plain", (("x", t, 2),),
                               (("q", "int8"), ("scale", "float32")), (("T", t),)))
        for body in ("rowsum", "rowsum_warp"):
            out.append(KernelBuild("quantize.cu", body, (("x", t, 2),), (("xa", "int8"),),
                                   (("T", t),)))
    for gs in (32, 64, 128):
        out.append(KernelBuild("quantize.cu", "sums", (("x", "bfloat16", 2),),
                               (("q", "int8"), ("scale", "float32"), ("row_sums", "int32")),
                               (("T", "bfloat16"), ("GS", gs))))
    # The subnormal promotion's quantize (codes as a + 128, uint8): every group size.
    for gs in (32, 64, 128):
        out.append(KernelBuild("quantize.cu", "sums_u8", (("x", "bfloat16", 2),),
                               (("q", "uint8"), ("scale", "float32"), ("row_sums", "int32")),
                               (("T", "bfloat16"), ("GS", gs))))
    # Activation groups' quantize: every dtype and group size.
    for i, t in enumerate(launch.FLOAT_DTYPES):
        for gs in (32, 64, 128):
            out.append(KernelBuild("quantize.cu", "groups", (("x", t, 2),),
                                   (("q", "int8"), ("scale", "float32"), ("sums", "int32")),
                                   (("T", t), ("GS", gs))))
    for key in ("wgmma", "large", "medium", "small"):
        tpl = tuple(cuda_tiles.ALL_GEMM_CONFIGS[key].template())
        file = cuda_tiles.ALL_GEMM_CONFIGS[key].file
        out.append(KernelBuild(file, "int32", (("a", "int8", 2), ("b", "int8", 2)),
                               (("c", "int32"),), tpl))
        for t, body in (("bfloat16", "channel"), ("float16", "channel_bias"),
                        ("float32", "channel"), ("bfloat16", "channel_u8"),
                        ("float16", "channel_u8_bias"), ("float32", "channel_u8"),
                        ("bfloat16", "channel_u8_bias")):
            out.append(KernelBuild(file, body, _channel_inputs(body), (("y", t),),
                                   (("T", t),) + tpl))
    for cfg in cuda_tiles.WS_CONFIGS.values():
        tpl = tuple(cfg.template())
        out.append(KernelBuild(cfg.file, "int32", (("a", "int8", 2), ("b", "int8", 2)),
                               (("c", "int32"),), tpl))
        # Each config's int32 body; the linear bodies in every dtype on every tile but
        # 128 x 128 (two there: it differs from 128 x 256 only in BN and STAGES).
        linear = (("bfloat16", "channel_u8"), ("float16", "channel_u8_bias"),
                  ("float32", "channel_u8"), ("bfloat16", "channel_u8_bias"))
        if cfg.bn == 128:
            linear = linear[:2]
        for t, body in linear:
            out.append(KernelBuild(cfg.file, body, _channel_inputs(body), (("y", t),),
                                   (("T", t),) + tpl))
        # Sibling launches (2 or 3 weights, one activation): every body on 128 x 256 (the
        # tile a summed N >= 256 takes), group3 on 128 x 128.
        group = (("bfloat16", "group3"), ("float16", "group3_bias"), ("bfloat16", "group2"),
                 ("float32", "group2_bias"))
        for t, body in group if cfg.bn == 256 else group[:1] if cfg.bn == 128 else ():
            out.append(KernelBuild(cfg.file, body, _group_inputs(body), _group_outputs(body, t),
                                   (("T", t),) + tpl))
    # The TMA producer's bodies: int32 with the maps' prototypes and their scratch output;
    # the linear bodies with each weight's map array (cuda_tma.weight_maps), no more outputs.
    for cfg in cuda_tiles.TMA_CONFIGS.values():
        tpl = tuple(cfg.template())
        out.append(KernelBuild(cfg.file, cfg.body("int32"),
                               (("a", "int8", 2), ("b", "int8", 2), ("proto", "uint8", 1)),
                               (("c", "int32"), ("tmap", "uint8")), tpl))
        for t, body in (("bfloat16", "channel_u8"), ("float16", "channel_u8_bias")):
            out.append(KernelBuild(cfg.file, cfg.body(body),
                                   _channel_inputs(body) + (("wmap", "uint8", 1),),
                                   (("y", t),), (("T", t),) + tpl))
        group = (("bfloat16", "group3"), ("float16", "group3_bias"), ("bfloat16", "group2"),
                 ("float32", "group2_bias"))
        for t, body in group if cfg.bn == 256 else group[:1]:
            maps = tuple((f"wmap{g}", "uint8", 1) for g in range(_group_members(body)))
            out.append(KernelBuild(cfg.file, cfg.body(body), _group_inputs(body) + maps,
                                   _group_outputs(body, t), (("T", t),) + tpl))
    for key in ("grouped", "grouped_small"):
        tpl = tuple(cuda_tiles.GEMM_CONFIGS[key].template())
        for gs, st, body in ((32, "float16", "grouped"), (64, "bfloat16", "grouped_bias"),
                             (128, "float32", "grouped")):
            ins = (("xq", "int8", 2), ("xs", "float32", 2), ("xr", "int32", 2),
                   ("w", "uint32", 2), ("ws", st, 2), ("wo", "float32", 2))
            if body.endswith("bias"):
                ins += (("bias", "float32", 1),)
            out.append(KernelBuild("gemm.cu", body, ins, (("y", "bfloat16"),),
                                   (("T", "bfloat16"), ("ST", st), ("GS", gs)) + tpl))
    # The group-wise TMA GEMM and its 4-bit form: every tile with every group size (GS and
    # the tile are its template arguments), output types and bias spread across them.
    # tma_grouped: 8-bit codes, per-token scales (the measured bodies); tma_groupwise: the
    # code width WB, activation groups AG and the MMA order ORD as template arguments
    # (4-bit per token, either width with activation groups; ORD below).
    for configs, stem, extra in (
            (cuda_tiles.GROUPED_TMA_CONFIGS, "tma_grouped", ()),
            (cuda_tiles.GROUPED4_TMA_CONFIGS, "tma_groupwise", (("WB", 4), ("AG", False), ("ORD", False), ("LIVE", False), ("PIPE", 0))),
            (cuda_tiles.GROUPED4_TMA_CONFIGS, "tma_groupwise", (("WB", 4), ("AG", True), ("ORD", False), ("LIVE", False), ("PIPE", 0))),
            (cuda_tiles.GROUPED_TMA_CONFIGS, "tma_groupwise", (("WB", 8), ("AG", True), ("ORD", False), ("LIVE", False), ("PIPE", 0)))):
        for i, cfg in enumerate(configs.values()):
            for j, gs in enumerate(cuda_tiles.GROUPED_TMA_GROUP_SIZES):
                t = launch.FLOAT_DTYPES[(i + j) % 3]
                body = stem + "_bias" if (i + j) % 2 else stem
                out.append(KernelBuild(cfg.file, body, _grouped_tma_inputs(body), (("y", t),),
                                       (("T", t), ("GS", gs)) + tuple(cfg.template()) + extra))
            # Sibling launches: every multi-weight body on the 128 x 128 tile (the tile a
            # summed N of q/k/v or gate/up takes at prefill), group3 on the others.
            group = (("bfloat16", "_group3", 64), ("float16", "_group3_bias", 128),
                     ("bfloat16", "_group2", 32), ("float32", "_group2_bias", 64))
            for t, suffix, gs in group if cfg.bn == 128 else group[:1]:
                members = int(suffix[len("_group")])
                out.append(KernelBuild(cfg.file, stem + suffix,
                                       _grouped_tma_group_inputs(suffix, members),
                                       tuple((f"y{g}", t) for g in range(members)),
                                       (("T", t), ("GS", gs)) + tuple(cfg.template()) + extra))
    # MMA order (ORD): every tile of either code width at group size 64, single and group3.
    for configs, bits in ((cuda_tiles.GROUPED_TMA_CONFIGS, 8), (cuda_tiles.GROUPED4_TMA_CONFIGS, 4)):
        for cfg in configs.values():
            tpl = (("GS", 64),) + tuple(cfg.template()) + (("WB", bits), ("AG", False), ("ORD", True),
                                                            ("LIVE", False), ("PIPE", 0))
            out.append(KernelBuild(cfg.file, "tma_groupwise", _grouped_tma_inputs("tma_groupwise"),
                                   (("y", "bfloat16"),), (("T", "bfloat16"),) + tpl))
            out.append(KernelBuild(cfg.file, "tma_groupwise_group3",
                                   _grouped_tma_group_inputs("_group3", 3),
                                   tuple((f"y{g}", "bfloat16") for g in range(3)),
                                   (("T", "bfloat16"),) + tpl))
    # Rows past M skipped (LIVE): every tile of either code width, single at group size 32
    # with a bias, group2 at 128, and once with activation groups and the MMA order.
    for configs, bits in ((cuda_tiles.GROUPED_TMA_CONFIGS, 8), (cuda_tiles.GROUPED4_TMA_CONFIGS, 4)):
        for cfg in configs.values():
            for gs, body, extra in ((32, "tma_groupwise_bias", (("AG", False), ("ORD", False))),
                                    (128, "tma_groupwise_group2", (("AG", False), ("ORD", False))),
                                    (64, "tma_groupwise", (("AG", True), ("ORD", True)))):
                tpl = ((("T", "bfloat16"), ("GS", gs)) + tuple(cfg.template())
                       + (("WB", bits),) + extra + (("LIVE", True), ("PIPE", 0)))
                if body.endswith("group2"):
                    out.append(KernelBuild(cfg.file, body, _grouped_tma_group_inputs("_group2", 2),
                                           (("y0", "bfloat16"), ("y1", "bfloat16")), tpl))
                else:
                    out.append(KernelBuild(cfg.file, body, _grouped_tma_inputs(body),
                                           (("y", "bfloat16"),), tpl))
    # Pipelined promotion (PIPE): every tile of either code width with every run it takes
    # (PIPE_RUNS), the group size, body, activation groups and the skip rotating over them
    # (the two int32 sets are where spills and serialized wgmmas would show).
    variants = ((64, "tma_groupwise", False, False), (128, "tma_groupwise_group3_bias", False, True),
                (32, "tma_groupwise_bias", True, False), (64, "tma_groupwise_group2", False, True))
    v = 0
    for configs, bits in ((cuda_tiles.GROUPED_TMA_CONFIGS, 8), (cuda_tiles.GROUPED4_TMA_CONFIGS, 4)):
        for cfg in configs.values():
            for run in cuda_tiles.PIPE_RUNS[cfg.bn]:
                gs, body, ag, live = variants[v % len(variants)]
                v += 1
                tpl = ((("T", "bfloat16"), ("GS", gs)) + tuple(cfg.template())
                       + (("WB", bits), ("AG", ag), ("ORD", False), ("LIVE", live), ("PIPE", run)))
                members = 3 if "_group3" in body else 2 if "_group2" in body else 0
                if members:
                    suffix = body[len("tma_groupwise"):]
                    out.append(KernelBuild(cfg.file, body, _grouped_tma_group_inputs(suffix, members),
                                           tuple((f"y{g}", "bfloat16") for g in range(members)), tpl))
                else:
                    out.append(KernelBuild(cfg.file, body, _grouped_tma_inputs(body),
                                           (("y", "bfloat16"),), tpl))
    # The subnormal promotion (bodies tma_subnormal*, uint8 activation codes): every tile
    # with every group size (GB: tiles.sub_groups), output types and bias spread across
    # them; two sibling bodies on every tile, the four between them (the bfloat16 offset
    # wgmma beside the u8 x u8 ones is where a serialized wgmma would show).
    for i, cfg in enumerate(cuda_tiles.SUB_TMA_CONFIGS.values()):
        sub = (("WB", cfg.bits),)
        for j, gs in enumerate(cuda_tiles.GROUPED_TMA_GROUP_SIZES):
            t = launch.FLOAT_DTYPES[(i + j) % 3]
            body = "tma_subnormal_bias" if (i + j) % 2 else "tma_subnormal"
            ins = (("xq", "uint8", 2),) + _grouped_tma_inputs(body)[1:]
            out.append(KernelBuild(cfg.file, body, ins, (("y", t),),
                                   (("T", t), ("GS", gs)) + tuple(cfg.template()) + sub
                                   + (("GB", cuda_tiles.sub_groups(gs)),)))
        siblings = ((("_group3", 3, 64), ("_group2_bias", 2, 128)) if i % 2 == 0 else
                    (("_group3_bias", 3, 32), ("_group2", 2, 64)))
        for suffix, members, gs in siblings:
            ins = (("xq", "uint8", 2),) + _grouped_tma_group_inputs(suffix, members)[1:]
            out.append(KernelBuild(cfg.file, "tma_subnormal" + suffix, ins,
                                   tuple((f"y{g}", "bfloat16") for g in range(members)),
                                   (("T", "bfloat16"), ("GS", gs)) + tuple(cfg.template()) + sub
                                   + (("GB", cuda_tiles.sub_groups(gs)),)))
    gemv_bodies = (("channel", None, None), ("channel_bias", None, None),
                   ("grouped", "float16", 32), ("grouped_bias", "bfloat16", 64))
    gemv_bodies += tuple(("fused_" + b, st, gs) for b, st, gs in gemv_bodies)
    for i, mm in enumerate((1, 2, 4, 8, 16)):
        rw = cuda_gemv.gemv_rows_per_warp(mm)
        for j, (body, st, gs) in enumerate(gemv_bodies):
            if (i + j) % 2 and mm not in (1, 16):
                continue  # every body at M = 1 and 16; the middle buckets alternate
            fused = body.startswith("fused_")
            if fused:
                ins = (("x", "bfloat16" if st is None else "float16", 2), ("w", "uint32", 2))
            else:
                ins = (("xq", "int8", 2), ("xs", "float32", 2), ("w", "uint32", 2))
            if st is None:
                ins += (("ws", "float32", 1),)
                tpl = (("T", "bfloat16"),)
            else:
                ins += (("ws", st, 2), ("wo", "float32", 2))
                tpl = (("T", "float16"), ("ST", st), ("GS", gs))
            if body.endswith("bias"):
                ins += (("bias", "float32", 1),)
            tpl += (("MM", mm), ("RW", rw))
            if fused:
                tpl += (("SMEM_BYTES", mm * 4096),)
            out.append(KernelBuild("gemv.cu", body, ins, (("y", tpl[0][1]),), tpl))
    # Sibling launches of the fused GEMV: every body at M = 1 (decode), half of them at
    # M = 16 (the largest bucket: the most accumulators per warp).
    for i, (fmt, g, bias) in enumerate((f, g, b) for f in ("channel", "grouped")
                                       for g in (2, 3) for b in (False, True)):
        body = f"fused_{fmt}_group{g}" + ("_bias" if bias else "")
        for mm in (1, 16) if i % 2 else (1,):
            ins = (("x", "bfloat16", 2),)
            tpl = (("T", "bfloat16"),)
            if fmt == "grouped":
                tpl += (("ST", "float16"), ("GS", 64))
            for m in range(g):
                ins += ((f"w{m}", "uint32", 2),)
                ins += ((f"ws{m}", "float32", 1),) if fmt == "channel" else (
                    (f"ws{m}", "float16", 2), (f"wo{m}", "float32", 2))
                if bias:
                    ins += ((f"bias{m}", "float32", 1),)
            tpl += (("MM", mm), ("RW", cuda_gemv.gemv_rows_per_warp(mm)), ("SMEM_BYTES", mm * 4096))
            out.append(KernelBuild("gemv.cu", body, ins,
                                   tuple((f"y{m}", "bfloat16") for m in range(g)), tpl))
    # The 4-bit GEMV (packed codes, scales and biases of one dtype): every body at every
    # bucket, each group size and scale dtype somewhere; siblings at M = 1 and 16.
    gemv4 = ("grouped4", "grouped4_bias", "fused_grouped4", "fused_grouped4_bias")
    for i, mm in enumerate((1, 2, 4, 8, 16)):
        for j, body in enumerate(gemv4):
            st = ("float16", "bfloat16", "float32")[(i + j) % 3]
            gs = (32, 64, 128)[(i + 2 * j) % 3]
            t = ("bfloat16", "float16", "float32")[(i + j + 1) % 3]
            fused = body.startswith("fused_")
            ins = ((("x", t, 2),) if fused else (("xq", "int8", 2), ("xs", "float32", 2)))
            ins += (("w", "uint32", 2), ("ws", st, 2), ("wo", st, 2))
            if body.endswith("bias"):
                ins += (("bias", "float32", 1),)
            tpl = (("T", t), ("ST", st), ("GS", gs), ("MM", mm),
                   ("RW", cuda_gemv.gemv_rows_per_warp(mm)))
            if fused:
                tpl += (("SMEM_BYTES", mm * 4096),)
            out.append(KernelBuild("gemv.cu", body, ins, (("y", t),), tpl))
    for i, (g, bias) in enumerate((g, b) for g in (2, 3) for b in (False, True)):
        body = f"fused_grouped4_group{g}" + ("_bias" if bias else "")
        for mm in (1, 16):
            ins = (("x", "bfloat16", 2),)
            for m in range(g):
                ins += ((f"w{m}", "uint32", 2), (f"ws{m}", "bfloat16", 2),
                        (f"wo{m}", "bfloat16", 2))
                if bias:
                    ins += ((f"bias{m}", "float32", 1),)
            tpl = (("T", "bfloat16"), ("ST", "bfloat16"), ("GS", (32, 64, 128)[i % 3]),
                   ("MM", mm), ("RW", cuda_gemv.gemv_rows_per_warp(mm)),
                   ("SMEM_BYTES", mm * 4096))
            out.append(KernelBuild("gemv.cu", body, ins,
                                   tuple((f"y{m}", "bfloat16") for m in range(g)), tpl))
    # The tensor-core small-M GEMV: every body, each token-tile count and warp count,
    # both group sizes and scale dtypes somewhere.
    for i, (body, nt) in enumerate((b, nt) for b in ("channel", "channel_bias", "grouped",
                                                     "grouped_bias") for nt in (1, 2, 4)):
        t = ("bfloat16", "float16", "float32")[i % 3]
        ins = (("xq", "int8", 2), ("xs", "float32", 2), ("w", "uint32", 2))
        tpl = (("T", t),)
        if body.startswith("grouped"):
            st = ("bfloat16", "float16", "float32")[(i + 1) % 3]
            ins += (("ws", st, 2), ("wo", "float32", 2))
            tpl += (("ST", st), ("GS", (64, 128)[i % 2]))
        else:
            ins += (("ws", "float32", 1),)
        if body.endswith("bias"):
            ins += (("bias", "float32", 1),)
        tpl += (("NT", nt), ("W", cuda_gemv.MMA_GEMV_WARPS), ("D", (2, 4)[(i // 3) % 2]))
        out.append(KernelBuild("gemv_mma.cu", body, ins, (("y", t),), tpl + (("RT", 1),)))
        if nt == (1, 2, 4)[i % 3] and i % 2 == 0:  # more row tiles a block (RT NT <= 8),
            out.append(KernelBuild("gemv_mma.cu", body, ins, (("y", t),),  # shipped depth
                                   tpl[:-1] + (("D", 2), ("RT", 2 if nt == 4 else 4))))
    # Its 4-bit bodies (packed codes, scales and biases of one dtype), each group size,
    # scale dtype and depth somewhere; siblings at NT 2 and 4.
    for i, body in enumerate(("grouped4", "grouped4_bias", "grouped4_group2",
                              "grouped4_group2_bias", "grouped4_group3", "grouped4_group3_bias")):
        st = ("bfloat16", "float16", "float32")[i % 3]
        t = ("bfloat16", "float16", "float32")[(i + 1) % 3]
        members = int(body[len("grouped4_group")]) if "_group" in body else 1
        ins = (("xq", "int8", 2), ("xs", "float32", 2))
        for m in range(members):
            suffix = str(m) if members > 1 else ""
            ins += ((f"w{suffix}", "uint32", 2), (f"ws{suffix}", st, 2), (f"wo{suffix}", st, 2))
            if body.endswith("bias"):
                ins += ((f"bias{suffix}", "float32", 1),)
        outs = tuple((f"y{m}" if members > 1 else "y", t) for m in range(members))
        tpl = (("T", t), ("ST", st), ("GS", (64, 128)[i % 2]), ("NT", (1, 2, 4)[i % 3]),
               ("W", cuda_gemv.MMA_GEMV_WARPS), ("D", (2, 4)[(i // 2) % 2]))
        out.append(KernelBuild("gemv_mma.cu", body, ins, outs, tpl + (("RT", 1),)))
        if i % 3 != 1:  # two row tiles a block at NT 1 and 4, the shipped depth
            out.append(KernelBuild("gemv_mma.cu", body, ins, outs, tpl[:-1] + (("D", 2), ("RT", 2))))
    # Its sibling launches: every body, at M = 16 (NT 2) and 32 (NT 4) alternately.
    for i, (fmt, g, bias) in enumerate((f, g, b) for f in ("channel", "grouped")
                                       for g in (2, 3) for b in (False, True)):
        body = f"{fmt}_group{g}" + ("_bias" if bias else "")
        ins = (("xq", "int8", 2), ("xs", "float32", 2))
        tpl = (("T", "bfloat16"),)
        if fmt == "grouped":
            tpl += (("ST", "bfloat16"), ("GS", (64, 128)[i % 2]))
        for m in range(g):
            ins += ((f"w{m}", "uint32", 2),)
            ins += ((f"ws{m}", "float32", 1),) if fmt == "channel" else (
                (f"ws{m}", "bfloat16", 2), (f"wo{m}", "float32", 2))
            if bias:
                ins += ((f"bias{m}", "float32", 1),)
        tpl += (("NT", (2, 4)[i % 2]), ("W", cuda_gemv.MMA_GEMV_WARPS),
                ("D", cuda_gemv.MMA_GEMV_DEPTH))
        for rt in (1, 2) if i % 3 == 0 else (1,):
            out.append(KernelBuild("gemv_mma.cu", body, ins,
                                   tuple((f"y{m}", "bfloat16") for m in range(g)),
                                   tpl + (("RT", rt),)))
    # The dequantizing GEMM: every dtype, code width and group size on the 128- and
    # 256-token tiles, the two bodies alternating; the 64-token tile on four of them.
    for i, (t, bits, gs) in enumerate((t, b, g) for t in ("bfloat16", "float16")
                                      for b in (8, 4) for g in (32, 64, 128)):
        body = ("dequant", "dequant_bias")[i % 2]
        ins = (("x", t, 2), ("w", "uint32", 2), ("ws", t, 2), ("wb", t, 2),
               ("proto", "uint8", 1))
        if body.endswith("bias"):
            ins += (("bias", "float32", 1),)
        for name in ("dq256", "dq128", "dq64") if i % 3 == 0 else ("dq256", "dq128"):
            cfg = cuda_tiles.DEQUANT_CONFIGS[name]
            out.append(KernelBuild(cfg.file, body, ins, (("y", t), ("scratch", "uint8")),
                                   (("T", t), ("BITS", bits), ("GS", gs), *cfg.template())))
    # The dequantize kernel (cuda_dequant_matmul's first step): every dtype, code width
    # and group size.
    for t, bits, gs in ((t, b, g) for t in ("bfloat16", "float16") for b in (8, 4)
                        for g in (32, 64, 128)):
        out.append(KernelBuild("dequantize.cu", "dequantize",
                               (("w", "uint32", 2), ("ws", t, 2), ("wb", t, 2)), (("y", t),),
                               (("T", t), ("BITS", bits), ("GS", gs))))
    return out


def block_threads(build: KernelBuild) -> int:
    """The largest block the launchers make for ``build``: the quantize launcher's cap
    (its blocks grow with K), the GEMV's fixed block, or the threads of the GEMM tile
    config whose file and template the build carries."""
    if build.file == "quantize.cu":
        return cuda_quantize.QUANT_WARP_THREADS if build.body == "rowsum_warp" else cuda_quantize.QUANT_MAX_THREADS
    if build.file == "gemv.cu":
        return cuda_gemv.GEMV_THREADS
    if build.file == "gemv_mma.cu":
        return 32 * dict(build.template)["W"]
    if build.file == "dequantize.cu":
        return cuda_dequant_matmul.DEQUANTIZE_THREADS
    tpl = set(build.template)
    found = {cfg.threads for cfg in (*cuda_tiles.ALL_GEMM_CONFIGS.values(), *cuda_tiles.WS_CONFIGS.values(),
                                     *cuda_tiles.TMA_CONFIGS.values(),
                                     *cuda_tiles.GROUPED_TMA_CONFIGS.values(),
                                     *cuda_tiles.GROUPED4_TMA_CONFIGS.values(),
                                     *cuda_tiles.SUB_TMA_CONFIGS.values(),
                                     *cuda_tiles.DEQUANT_CONFIGS.values())
             if cfg.file == build.file and set(cfg.template()) <= tpl}
    assert len(found) == 1, (_label(build), found)
    return found.pop()


def _kernel_text(build: KernelBuild, name: str) -> str:
    """``build``'s ``__global__`` function named ``name``, as MLX writes it around the
    body (in ``mlx::core::cu``, after the file's header)."""
    body = launch.load(build.file)[1][build.body]
    params = []
    for arg, dtype, ndim in build.inputs:
        params.append(f"    const {CUDA_TYPES[dtype]}* {arg}")
        if ndim > 0:  # custom_kernel.cpp: shape/strides/ndim only if the body names them
            if f"{arg}_shape" in body:
                params.append(f"    const __grid_constant__ Shape {arg}_shape")
            if f"{arg}_strides" in body:
                params.append(f"    const __grid_constant__ Strides {arg}_strides")
            if f"{arg}_ndim" in body:
                params.append(f"    const __grid_constant__ int {arg}_ndim")
    for arg, dtype in build.outputs:
        params.append(f"    {CUDA_TYPES[dtype]}* {arg}")
    consts = []
    for key, value in build.template:
        if isinstance(value, bool):
            consts.append(f"  constexpr bool {key} = {'true' if value else 'false'};")
        elif isinstance(value, int):
            consts.append(f"  constexpr int {key} = {value};")
        else:
            consts.append(f"  using {key} = {CUDA_TYPES[value]};")
    return (f"__global__ void {name}(\n" + ",\n".join(params) + ") {\n"
            + "\n".join(consts) + "\n\n" + body + "\n}\n\n")


def _unit(file: str, kernels: list[str]) -> str:
    """A translation unit of ``file``'s header and ``kernels`` (from :func:`_kernel_text`)."""
    return (DEFAULT_HEADER + launch.load(file)[0]
            + "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
            + "".join(kernels) + "} // namespace mlx::core::cu\n")


def wrap(build: KernelBuild) -> str:
    """The full translation unit MLX would hand to NVRTC for ``build``."""
    name = f"custom_kernel_w8a8_{build.file[:-3]}_{build.body}"
    return _unit(build.file, [_kernel_text(build, name)])


def batch_marker(j: int) -> str:
    """What the name of a batch's ``j``-th kernel carries, unique in the batch (it
    survives C++ name mangling, so ptxas's lines about the kernel name it)."""
    return f"custom_kernel_b{j:03d}_"


def wrap_batch(builds: list[KernelBuild]) -> str:
    """One translation unit holding every build of ``builds`` (one file's), each kernel
    as :func:`wrap` writes it but named by :func:`batch_marker`: nvcc's fixed cost (its
    front end reading the CUDA headers, about 4 s a unit on two cores) is paid once for
    them all, and ptxas still compiles, allocates and reports each kernel on its own."""
    assert len({b.file for b in builds}) == 1, "a batch holds one file's builds"
    return _unit(builds[0].file, [
        _kernel_text(b, f"{batch_marker(j)}w8a8_{b.file[:-3]}_{b.body}")
        for j, b in enumerate(builds)])


def split_log(log: str, count: int) -> list[str]:
    """Each of a batch's ``count`` kernels' part of ptxas's ``-v`` log: the lines from
    its ``Compiling entry function`` on to the next one's, and any line naming it (a
    warning about it); lines about no kernel (the front end's, before the first entry)
    go to every part."""
    parts: list[list[str]] = [[] for _ in range(count)]
    current = None
    for line in log.splitlines():
        named = [j for j in range(count) if batch_marker(j) in line]
        if "Compiling entry function" in line:
            current = named[0] if named else None
        for j in (named or ([current] if current is not None else range(count))):
            parts[j].append(line)
    return ["\n".join(p) for p in parts]


def _label(build: KernelBuild) -> str:
    return f"{build.file}:{build.body}:" + ",".join(f"{k}={v}" for k, v in build.template)


# Successful compiles are remembered by the digest of everything that decides them (the
# wrapped source, the stand-in header, the flags, nvcc's version), so an unchanged kernel
# is not compiled again on every run; a failure is always recompiled and shown.
NVCC_CACHE = os.environ.get("MLX_W8A8_NVCC_CACHE") or os.path.join(
    tempfile.gettempdir(), "mlx_w8a8_nvcc_cache")


# What a log read back from the cache starts with.
CACHED = "(compiled before, same digest) "
# Builds per translation unit (batches): fewer units cost less front end, more keep the
# compile jobs busy and make a cache miss recompile less.
BATCH = 12


@functools.lru_cache(maxsize=1)
def _nvcc_version() -> str:
    return subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout


def _nvcc(text: str, workdir: str, index) -> tuple[int, str]:
    """Compile ``text`` for sm_90a with ptxas's ``-v`` report: ``(status, log)``,
    remembered by digest when it succeeds."""
    flags = [ARCH, "-std=c++17", "-Xptxas", "-v", "-c"]
    key = hashlib.sha256("\0".join([text, STAND_IN_UTILS, " ".join(flags), _nvcc_version()])
                         .encode()).hexdigest()[:32]
    done = os.path.join(NVCC_CACHE, key + ".log")
    if os.path.exists(done):
        with open(done) as f:
            return 0, CACHED + f.read()
    src = os.path.join(workdir, f"k{index}.cu")
    with open(src, "w") as f:
        f.write(text)
    cmd = [NVCC, *flags[:-1], "-I", workdir, "-c", src, "-o", os.path.join(workdir, f"k{index}.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode == 0:
        os.makedirs(NVCC_CACHE, exist_ok=True)
        tmp = f"{done}.{os.getpid()}.{index}.tmp"
        with open(tmp, "w") as f:
            f.write(log)
        os.replace(tmp, done)
    return proc.returncode, log


def _compile(build: KernelBuild, workdir: str, index) -> tuple[int, str]:
    return _nvcc(wrap(build), workdir, index)


def _compile_batch(builds: list[KernelBuild], workdir: str, index: int) -> list[tuple[int, str]]:
    """Each build's ``(status, log)``, the batch compiled as one unit; where that fails,
    each build alone, so that a failure names the kernel it is in."""
    rc, log = _nvcc(wrap_batch(builds), workdir, f"b{index}")
    if rc != 0:
        return [_compile(b, workdir, f"b{index}_{j}") for j, b in enumerate(builds)]
    cached = log.startswith(CACHED)
    return [(0, (CACHED if cached else "") + part)
            for part in split_log(log.removeprefix(CACHED), len(builds))]


def batches(builds: list[KernelBuild], size: int = BATCH) -> list[list[int]]:
    """``builds``' indices in batches of one file's builds, at most ``size`` each."""
    by_file: dict[str, list[int]] = {}
    for i, b in enumerate(builds):
        by_file.setdefault(b.file, []).append(i)
    return [ids[i:i + size] for ids in by_file.values() for i in range(0, len(ids), size)]


BUILDS = kernel_builds()


def _spill_bytes(line: str) -> int:
    """The spill stores of one of ptxas's ``N bytes stack frame, N bytes spill stores, N
    bytes spill loads`` lines."""
    found = re.search(r"(\d+) bytes spill stores", line)
    return int(found.group(1)) if found else 0


def test_every_build_has_a_block_size():
    """block_threads finds each build's launch block (one tile config per GEMM build)."""
    sizes = {_label(b): block_threads(b) for b in BUILDS}
    assert all(32 <= t <= 1024 and t % 32 == 0 for t in sizes.values()), sizes


def test_every_shipped_kernel_file_has_builds():
    """Each .cu file shipped is covered by kernel_builds(), so none escapes compilation."""
    from importlib import resources

    shipped = {p.name for p in resources.files("mlx_w8a8").joinpath("shaders", "cuda").iterdir()
               if p.name.endswith(".cu")}
    built = {b.file for b in BUILDS}
    assert shipped == built, f"kernel files without a compile check: {shipped - built}"
    for file in shipped:
        _, bodies = sources.split(sources.read("cuda", file))
        covered = {b.body for b in BUILDS if b.file == file}
        assert covered == set(bodies), f"{file}: bodies never compiled: {set(bodies) - covered}"


def test_split_log_gives_each_batched_kernel_its_own_lines():
    # ptxas -v on a batch of three: a warning naming kernel 2 printed before its entry, a
    # spill in kernel 0's section, a front-end line about none of them.
    m = [f"_ZN3mlx4core2cu40{batch_marker(j)}w8a8_gemv_channelEPKa" for j in range(3)]
    log = "\n".join([
        "k.cu(64): warning #177-D: variable declared but never referenced",
        f"ptxas info    : (C7520) wgmma.mma_async instructions are serialized in the function '{m[2]}'",
        f"ptxas info    : Compiling entry function '{m[0]}' for 'sm_90a'",
        f"ptxas info    : Function properties for {m[0]}",
        "    8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads",
        "ptxas info    : Used 232 registers",
        f"ptxas info    : Compiling entry function '{m[1]}' for 'sm_90a'",
        "ptxas info    : Used 40 registers",
        f"ptxas info    : Compiling entry function '{m[2]}' for 'sm_90a'",
        "ptxas info    : Used 168 registers",
    ])
    parts = split_log(log, 3)
    assert all("warning #177-D" in p for p in parts)
    assert ["spill stores" in p for p in parts] == [True, False, False]
    assert ["are serialized" in p for p in parts] == [False, False, True]
    assert [re.findall(r"Used (\d+) registers", p) for p in parts] == [["232"], ["40"], ["168"]]


def test_a_failed_batch_is_compiled_build_by_build(monkeypatch, tmp_path):
    # The batch's unit fails: each build compiles alone, so the failure names its kernel.
    builds = [b for b in BUILDS if b.file == "quantize.cu"][:3]
    calls = []

    def nvcc(text, workdir, index):
        calls.append(index)
        if str(index).count("_") == 0:  # the batch's unit
            return 1, "error in the unit"
        return (1, "error: here") if index == "b7_1" else (0, "ptxas info    : Used 30 registers")

    monkeypatch.setattr(sys.modules[__name__], "_nvcc", nvcc)
    out = _compile_batch(builds, str(tmp_path), 7)
    assert calls == ["b7", "b7_0", "b7_1", "b7_2"]
    assert [rc for rc, _ in out] == [0, 1, 0] and out[1][1] == "error: here"


def test_batches_hold_one_file_each_and_every_build_once():
    groups = batches(BUILDS, 5)
    assert sorted(i for g in groups for i in g) == list(range(len(BUILDS)))
    assert all(0 < len(g) <= 5 and len({BUILDS[i].file for i in g}) == 1 for g in groups)


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: CUDA kernels not compiled here")
def test_kernels_compile_for_sm90a(tmp_path):
    inc = tmp_path / "mlx" / "backend" / "cuda" / "device"
    inc.mkdir(parents=True)
    (inc / "utils.cuh").write_text(STAND_IN_UTILS)
    jobs = max(1, min(8, os.cpu_count() or 1))
    groups = batches(BUILDS)
    with ThreadPoolExecutor(jobs) as pool:
        done = list(pool.map(
            lambda ig: _compile_batch([BUILDS[i] for i in ig[1]], str(tmp_path), ig[0]),
            enumerate(groups)))
    by_index = {i: out for ids, outs in zip(groups, done) for i, out in zip(ids, outs)}
    results = [by_index[i] for i in range(len(BUILDS))]
    failures, serialized, spilled, oversized = [], [], [], []
    for build, (rc, log) in zip(BUILDS, results):
        spills = [ln.strip() for ln in log.splitlines() if "spill" in ln and not ln.strip().startswith("0 bytes")]
        regs = [ln.split("Used")[-1].strip() for ln in log.splitlines() if "Used" in ln]
        print(f"{_label(build)}: rc={rc} {'; '.join(regs)} {'; '.join(spills)}")
        if rc != 0:
            failures.append(f"{_label(build)}\n{log[-3000:]}")
        # The TMA tiles with a producer warpgroup and the dequantizing GEMM hand the
        # producers' registers to the consumers (setmaxnreg): at ptxas's cap of 168 the
        # TMA tiles' bias and sibling bodies spilled up to 868 bytes in the epilogue;
        # with 232 none may.
        # One exception: with the pipelined promotion's second int32 set, the 4-bit
        # 128-wide sibling bodies with LIVE keep two tile counts in 8 bytes of local
        # memory, stored before the warp roles split and loaded once per role (outside
        # every loop: cuobjdump -sass of that build); a spill in the mainloop is larger.
        # Another: the 4-bit subnormal bodies' producer warpgroup (40 registers, the
        # terms' extra offsets) keeps the grid stride and member pointers in up to 12
        # bytes, stored before the tile loop and loaded once per tile, outside the k-tile
        # loop (cuobjdump -sass of the 64 / group3 build). And the subnormal consumers
        # (the next group's S pairs live through each wait) keep up to two tile values
        # (8 bytes) stored before the offset-block loop and loaded after it, in the
        # epilogue (cuobjdump -sass of the 8-bit 64 / bias and the 4-bit 64 / group3
        # builds): up to 8 bytes for 8-bit codes, 20 for 4-bit.
        # And one known cost, not a setup spill: the 4-bit subnormal body without bias or
        # siblings at group size 128 (the consumers' pipelined block of 4 groups, 16
        # wgmmas) keeps a few values in local memory inside the block loop, 13 stores and
        # loads per block beside 256 fmas per thread (cuobjdump -sass); no prior rule
        # picks that kernel, and its bias and sibling bodies do not spill.
        tpl = dict(build.template)
        sub = build.body.startswith("tma_subnormal")
        sub4 = sub and tpl.get("WB") == 4
        setup_only = ((tpl.get("PIPE") and all(_spill_bytes(ln) <= 8 for ln in spills))
                      or (sub and all(_spill_bytes(ln) <= (20 if sub4 else 8) for ln in spills))
                      or (sub4 and build.body == "tma_subnormal" and tpl.get("GS") == 128
                          and all(_spill_bytes(ln) <= 64 for ln in spills)))
        gives_registers = (build.body.startswith("tma_") and dict(build.template).get("PW") == 4
                           or build.file == "gemm_dequant.cu")
        if gives_registers and spills and not setup_only:
            spilled.append(f"{_label(build)}: {'; '.join(spills)}")
        # ptxas compiles a kernel whose wgmma pipeline it cannot prove safe by waiting
        # after every wgmma (C7520, "wgmma.mma_async instructions are serialized"): it
        # still runs and is exact, so only this check sees it. A branch around the
        # consumers' wgmma in gemm_ws.cu did that and cost 1.4x on an H200.
        # Likewise a warpgroup.arrive / wait that ptxas injects (C7519, C7517) to guard
        # accumulator registers that non-wgmma code copies between a set's wgmmas (an
        # accumulator set live into its first wgmma did that in the pipelined promotion).
        serialized += [f"{_label(build)}: {ln.strip()}" for ln in log.splitlines()
                       if any(code in ln for code in ("C7520", "C7517", "C7519"))
                       or "are serialized" in ln]
        # A block whose threads need more registers than an SM has (64 K 32-bit registers
        # on sm_90) does not launch, and MLX reports nothing: the outputs keep whatever
        # memory held (the FMA-remainder quantize, 71 registers, at 1024 threads for
        # K = 66304 on an H200). Checked against the largest block the launchers make.
        if rc == 0:
            threads = block_threads(build)
            used = [int(r.split()[0]) for r in regs]
            if not used or max(used) * threads > 65536:
                oversized.append(f"{_label(build)}: {used} registers x {threads} threads")
    assert not failures, "kernels that do not compile:\n" + "\n\n".join(failures)
    assert not oversized, "blocks larger than the register file:\n" + "\n".join(oversized)
    assert not serialized, "wgmma serialized by ptxas:\n" + "\n".join(serialized)
    assert not spilled, "register spills where setmaxnreg should prevent them:\n" + "\n".join(spilled)


# Launch plans, checked on any machine ----------------------------------------------------
def read_prototypes(array) -> list[tuple[int, int, int]]:
    """The ``(rows, k, box_rows)`` of each fake map in a launch's ``proto`` input."""
    raw = np.array(array).tobytes()
    return [tuple(int(v) for v in np.frombuffer(raw[i:i + 24], dtype=np.uint64))
            for i in range(0, len(raw), tensormap.MAP_BYTES)]


@pytest.fixture(autouse=True)
def tma_here(monkeypatch):
    """Tensor maps encodable as on a machine with the CUDA driver (fake maps)."""
    fake_tensor_maps(monkeypatch)
    yield
    cuda_tma._tma_prototypes.cache_clear()
    clear_frames()  # they hold the fake maps too


def clear_frames():
    """Empty the CUDA launch code's cached launch frames (each holds its TMA prototypes)."""
    for frame in (cuda_quantize._quantize_frame, cuda_gemm._gemm_per_channel_frame,
                  cuda_gemm_ws._gemm_ws_group_frame, cuda_gemm_grouped._gemm_grouped_frame,
                  cuda_gemm_grouped._gemm_grouped_tma_frame):
        frame.cache_clear()


def test_header_include_writes_once_repairs_and_falls_back(tmp_path, monkeypatch):
    """header_include: one file per header text (named by its digest) in the cache
    folder ``cuda/``; a file whose content differs is rewritten; where no folder can be
    written, or the path cannot stand in an #include line, the text itself is returned."""
    from mlx_w8a8 import cachedir

    monkeypatch.setenv(cachedir.ENV_CACHE_DIR, str(tmp_path / "cache"))
    launch.header_include.cache_clear()
    header = launch.load("quantize.cu")[0]
    line = launch.header_include("quantize", header)
    path = re.fullmatch(r'#include "([^"]+)"\n', line).group(1)
    assert os.path.dirname(path) == str(tmp_path / "cache" / "cuda")
    assert open(path, encoding="utf-8").read() == header
    other = launch.header_include("quantize", header + "\n")  # new text: a new file
    assert other != line
    with open(path, "w", encoding="utf-8") as f:
        f.write(header[:100])  # a truncated file (an interrupted writer elsewhere)
    launch.header_include.cache_clear()
    assert launch.header_include("quantize", header) == line
    assert open(path, encoding="utf-8").read() == header
    assert not [p for p in os.listdir(os.path.dirname(path)) if p.endswith(".tmp")]
    # writers at once (threads of one process; the cache bypassed): each writes a file of
    # its own and renames it, so the file is whole whoever renames last
    from concurrent.futures import ThreadPoolExecutor

    os.unlink(path)
    with ThreadPoolExecutor(8) as pool:
        lines = list(pool.map(lambda _: launch.header_include.__wrapped__("quantize", header),
                              range(32)))
    assert set(lines) == {line}
    assert open(path, encoding="utf-8").read() == header
    assert not [p for p in os.listdir(os.path.dirname(path)) if p.endswith(".tmp")]

    def no_folder(kind):
        raise OSError("read-only")

    launch.header_include.cache_clear()
    monkeypatch.setattr(cachedir, "folder", no_folder)
    assert launch.header_include("quantize", header) == header
    launch.header_include.cache_clear()
    quoted = tmp_path / 'a"b'
    monkeypatch.setattr(cachedir, "folder", lambda kind: str(quoted))
    assert launch.header_include("quantize", header) == header
    launch.header_include.cache_clear()


def _launch_all():
    """Every launcher, on CPU arrays, over the shapes and configs they can take."""
    import mlx.core as mx

    from mlx_w8a8.weight import QuantizedWeight

    for m, k in ((1, 64), (7, 4096), (3, 18944), (9, 4096)):
        for gs in (None, 32, 64, 128):
            cuda_quantize.quantize(mx.zeros((m, k), dtype=mx.bfloat16), gs)
        cuda_quantize.quantize(mx.zeros((m, k), dtype=mx.float16), None, row_sum=True)
        cuda_quantize.quantize(mx.zeros((m, k), dtype=mx.float32), None, row_sum=True, warp=True)
    a = mx.zeros((300, 256), dtype=mx.int8)
    b = mx.zeros((264, 256), dtype=mx.int8)
    configs = (list(cuda_tiles.ALL_GEMM_CONFIGS.values()) + list(cuda_tiles.WS_CONFIGS.values())
               + list(cuda_tiles.TMA_CONFIGS.values()))
    for cfg in configs:
        cuda_gemm.int8_gemm(a, b, cfg)
    cuda_gemm_ws.int8_gemm_ws(mx.zeros((4096, 256), dtype=mx.int8), mx.zeros((4096, 256), dtype=mx.int8))
    cuda_gemm_ws.int8_gemm_tma(mx.zeros((4096, 256), dtype=mx.int8), mx.zeros((100, 256), dtype=mx.int8))
    w = mx.random.normal((264, 256))
    pc = QuantizedWeight.from_float(w, 64, per_channel=True)
    gr = QuantizedWeight.from_float(w.astype(mx.float16), 32, per_channel=False)
    bias = mx.zeros((264,), dtype=mx.bfloat16)
    for cfg in configs:
        xq, xs = mx.zeros((300, 256), dtype=mx.int8), mx.ones((300, 1))
        ws = isinstance(cfg, cuda_tiles.WsConfig)
        if ws or cfg.wgmma or cfg.wtn >= 64:
            if not ws:
                cuda_gemm.gemm_per_channel(xq, xs, pc, bias, mx.float16, cfg)
                cuda_gemm.gemm_per_channel(xq, xs, pc, None, mx.float32, cfg)
            xr1 = mx.zeros((300, 1), dtype=mx.int32)
            cuda_gemm.gemm_per_channel(xq, xs, pc, bias, mx.bfloat16, cfg, row_sums=xr1)
            cuda_gemm.gemm_per_channel(xq, xs, pc, None, mx.float16, cfg, row_sums=xr1)
        if not ws and not cfg.wgmma:
            xr = mx.zeros((300, 8), dtype=mx.int32)
            cuda_gemm_grouped.gemm_grouped(xq, xs, xr, gr, bias, mx.bfloat16, cfg)
    # Sibling launches on [..., K] activations: 2 and 3 weights, with and without bias.
    pc2 = QuantizedWeight.from_float(mx.random.normal((40, 256)), 64, per_channel=True)
    xa3 = (mx.zeros(cuda_quantize.rowsum_shape(300, 256), dtype=mx.int8),)  # the activation array
    for members in ([(pc, None), (pc2, None)], [(pc, bias), (pc2, bias), (pc, bias)],
                    [(pc2, None), (pc2, None), (pc, None)], [(pc, bias), (pc, bias)]):
        ys = cuda_gemm_ws.gemm_ws_group_spec(300, 256, members, mx.bfloat16,
                                             lead=(2, 150)).launch(*xa3)
        assert [y.shape for y in ys] == [(2, 150, w.n) for w, _ in members]
        for cfg in cuda_tiles.TMA_CONFIGS.values():  # one output per member, no more
            ys = cuda_gemm_ws.gemm_ws_group_spec(300, 256, members, mx.bfloat16, cfg,
                                                 lead=(2, 150)).launch(*xa3)
            assert [y.shape for y in ys] == [(2, 150, w.n) for w, _ in members]
    cuda_quantize.quantize_spec(300, 256, mx.bfloat16, None, True, lead=(2, 150)).launch(
        mx.zeros((2, 150, 256), dtype=mx.bfloat16))
    g4 = QuantizedWeight.from_float(w.astype(mx.bfloat16), 64, per_channel=False, bits=4)
    for m in (1, 2, 3, 8, 16):
        for weight in (pc, gr, g4):
            for fused in (True, False):
                cuda_gemv.gemv(mx.zeros((m, 256), dtype=mx.bfloat16), weight,
                            bias if m % 2 else None, fused=fused)
    # The fused GEMV's sibling launches: both formats, 2 and 3 weights, bias or not.
    gr2 = QuantizedWeight.from_float(mx.random.normal((40, 256)).astype(mx.float16), 32,
                                     per_channel=False)
    for m, lead in ((1, (1, 1)), (16, (2, 8))):
        x = mx.zeros((*lead, 256), dtype=mx.bfloat16)
        g42 = QuantizedWeight.from_float(mx.random.normal((40, 256)).astype(mx.bfloat16), 64,
                                         per_channel=False, bits=4)
        for members in ([(pc, None), (pc2, None)], [(pc, bias), (pc2, bias), (pc, bias)],
                        [(gr, None), (gr2, None), (gr, None)], [(gr, bias), (gr2, bias)],
                        [(g4, None), (g42, None)], [(g4, bias), (g42, bias), (g4, bias)]):
            ys = cuda_gemv.gemv_fused_group_spec(m, 256, members, mx.bfloat16, lead).launch(x)
            assert [y.shape for y in ys] == [(*lead, w.n) for w, _ in members]


def test_rowsum_array_packs_and_unpacks(rng):
    """The unsigned-code GEMMs' one activation array (shaders/cuda/shape.cuh): M comes
    back from its rows for every M (the kernels' rowsum_m is the same arithmetic), the
    map area after the row sums is 256 bytes and less than a row more (room for a
    128-byte tensor map at any alignment), and pack/unpack keep every bit of codes,
    scales (NaN, -0, infinities, subnormals) and row sums (int32's ends) in the
    documented layout: codes, scales, row sums, zeros. Arrays past MLX's int32 rows and
    arrays of another layout are refused with the sizes."""
    import mlx.core as mx
    import numpy as np

    from mlx_w8a8.weight import QuantizedWeight

    area = cuda_quantize.ROWSUM_MAP_AREA

    def kernel_m(r, k):  # shape.cuh rowsum_m: 32-bit integers only
        q, rem = divmod(r, k + 8)
        assert q * k < 2**31 and 8 * rem + area + k + 7 < 2**31
        return q * k + rem - (8 * rem + area + k + 7) // (k + 8)

    def kernel_tail(m, k):  # shape.cuh rowsum_tail
        t = m % k
        return (8 * t + area + k - 1) // k * k - 8 * t

    for k in (8, 16, 48, 1088, 4096, 14336, 18944, 66304):
        for m in [*range(1, 600), 4095, 4096, 113_000, 2**20 + 3, 2**27 - 1,
                  ((2**31 - 1) * k - area) // (k + 8)]:  # the largest M of int32 rows
            r, kk = cuda_quantize.rowsum_shape(m, k)
            assert kk == k and r < 2**31 and cuda_quantize.rowsum_rows_m(r, k) == m, (m, k, r)
            assert kernel_m(r, k) == m, (m, k, r)
            assert area <= r * k - m * (k + 8) == kernel_tail(m, k) < area + k, (m, k, r)
    assert area == 2 * 128  # a 128-byte map at the first 128-byte aligned byte
    # M = 21: 8 M = 168 bytes of scales and sums, then a map area of 312 bytes
    lead, k = (3, 7), 96
    m = 21
    q = rng.integers(-127, 128, size=(*lead, k)).astype(np.int8)
    scale = rng.standard_normal((*lead, 1)).astype(np.float32)
    scale.reshape(-1)[:5] = [np.nan, -0.0, np.inf, -np.inf, np.float32(1e-45)]
    sums = rng.integers(-2**31, 2**31, size=(*lead, 1), dtype=np.int64).astype(np.int32)
    sums.reshape(-1)[:2] = [-2**31, 2**31 - 1]
    xa = cuda_quantize.pack_rowsum(mx.array(q), mx.array(scale), mx.array(sums))
    assert xa.dtype == mx.int8 and tuple(xa.shape) == cuda_quantize.rowsum_shape(m, k)
    raw = np.array(xa).reshape(-1)
    np.testing.assert_array_equal(raw[: m * k], q.reshape(-1))
    np.testing.assert_array_equal(raw[m * k: m * k + 4 * m].view(np.uint32),
                                  scale.reshape(-1).view(np.uint32))
    np.testing.assert_array_equal(raw[m * k + 4 * m: m * k + 8 * m].view(np.int32),
                                  sums.reshape(-1))
    assert raw.size == m * (k + 8) + 312 and not raw[m * (k + 8):].any()
    for want_lead in (None, lead):
        gq, gs, gr = cuda_quantize.unpack_rowsum(xa, want_lead)
        shape = want_lead or (m,)
        assert gq.shape == (*shape, k) and gs.shape == (*shape, 1) and gr.shape == (*shape, 1)
        assert gq.dtype == mx.int8 and gs.dtype == mx.float32 and gr.dtype == mx.int32
        np.testing.assert_array_equal(np.array(gq).reshape(q.shape), q)
        np.testing.assert_array_equal(np.array(gs).reshape(-1).view(np.uint32),
                                      scale.reshape(-1).view(np.uint32))
        np.testing.assert_array_equal(np.array(gr).reshape(sums.shape), sums)
    # Rows past MLX's int32 dimension: refused before anything is built. At K = 16,
    # R = M + 16 + ceil(M / 2): 1431655754 rows make 2^31 - 1 (taken), one more 2^31 + 1.
    fits = 1431655754
    frame = cuda_quantize._quantize_frame(fits, 16, mx.bfloat16, None, True, False, (fits,))
    assert frame.output_shapes == [(2**31 - 1, 16)]
    with pytest.raises(ValueError, match=r"cuda_quantize.*1431655755 rows of K = 16.*2147483649"):
        cuda_quantize.quantize_spec(fits + 1, 16, mx.bfloat16, row_sum=True)
    # The GEMM refuses what is not such an array for the weight's K (it can tell by the
    # shape only: codes alone of R rows pass where some M has R = rowsum_shape(M, K)[0]).
    pc = QuantizedWeight.from_float(mx.random.normal((40, k)), 32, per_channel=True)
    for bad in (mx.zeros((8, k), dtype=mx.int8),  # no M has 8 rows at K = 96 (M = 4: 7, M = 5: 9)
                xa.astype(mx.uint8),  # another dtype
                xa.reshape(-1),  # 1-D
                cuda_quantize.pack_rowsum(mx.zeros((m, 2 * k), dtype=mx.int8), mx.array(scale),
                                   mx.array(sums))):  # another K
        with pytest.raises(ValueError, match=r"cuda_w8a8_gemm.*rowsum_shape\(M, K=96\)"):
            cuda_gemm.gemm_rowsum(bad, pc, None, mx.bfloat16)


def test_quantize_row_sum_shapes(monkeypatch):
    """``quantize(row_sum=True)`` launches the one-array body and unpacks it to the three
    arrays; with a group size it launches the group-sums body as before (row_sum adds
    nothing there)."""
    import mlx.core as mx

    rec = record_launches(monkeypatch)
    launch._kernel.cache_clear()
    try:
        x = mx.zeros((21, 96), dtype=mx.bfloat16)
        q, scale, sums = cuda_quantize.quantize(x, row_sum=True)
        assert rec.launches[-1]["outputs"] == ["xa"]
        assert rec.launches[-1]["output_shapes"] == [cuda_quantize.rowsum_shape(21, 96)]
        assert (q.shape, scale.shape, sums.shape) == ((21, 96), (21, 1), (21, 1))
        q, scale, sums = cuda_quantize.quantize(x, 32, row_sum=True)
        assert rec.launches[-1]["name"] == "w8a8_quantize_sums" and sums.shape == (21, 3)
    finally:
        launch._kernel.cache_clear()


def test_gemv_sibling_launch_refuses_what_it_cannot_take():
    """The fused GEMV's sibling spec names the op, the value and what is valid: 2-3
    weights, one K / format / group size / scales dtype (the body has one ST), bias on
    all or none, x within shared memory."""
    import mlx.core as mx

    from mlx_w8a8.weight import QuantizedWeight

    def weight(n, k, per_channel=True, gs=64):
        return QuantizedWeight.from_float(mx.random.normal((n, k)), gs, per_channel=per_channel)

    pc, bias = weight(64, 256), mx.zeros((64,))
    cases = [
        ([(pc, None)], "takes 2 to 3 weights, got 1"),
        ([(pc, None)] * 4, "takes 2 to 3 weights, got 4"),
        ([(pc, bias), (pc, None)], r"all have a bias or none, got \[True, False\]"),
        ([(pc, None), (weight(64, 512), None)], "share K = 256.*got K=512"),
        ([(pc, None), (weight(64, 256, False), None)], "format=grouped"),
        ([(pc, None), (weight(64, 256, True, 32), None)], "group_size=32"),
        ([(weight(64, 256, False), None),
          (QuantizedWeight.from_float(mx.random.normal((64, 256)).astype(mx.float16), 64,
                                      per_channel=False), None)], "scales mlx.core.float16"),
    ]
    for members, match in cases:
        with pytest.raises(ValueError, match=r"\[mlx_w8a8.cuda_int8_gemv\] .*" + match):
            cuda_gemv.gemv_fused_group_spec(1, 256, members, mx.bfloat16)
    big = weight(64, 8192)
    assert not cuda_gemv.gemv_fuses(16, 8192)
    with pytest.raises(ValueError, match="fused kernel: needs .* got M=16, K=8192"):
        cuda_gemv.gemv_fused_group_spec(16, 8192, [(big, None), (big, None)], mx.bfloat16)


def test_launch_plans_are_compiled_and_consistent(monkeypatch):
    """What the launchers hand to MLX, recorded without a GPU: every (file, body, template
    names, tile) is among the builds the compile test compiles; every argument name is one
    the body uses; block sizes are whole warps within limits; shared memory fits a block."""
    rec = record_launches(monkeypatch)
    launch._kernel.cache_clear()
    try:
        _launch_all()
    finally:
        launch._kernel.cache_clear()
    assert rec.launches
    built = {}
    for b in BUILDS:
        key = (b.file, b.body)
        built.setdefault(key, set()).add(tuple(k for k, _ in b.template))
    tiles = {tuple(c.template()) for c in cuda_tiles.ALL_GEMM_CONFIGS.values()}
    tiles |= {tuple(c.template()) for c in cuda_tiles.WS_CONFIGS.values()}
    tiles |= {tuple(c.template()) for c in cuda_tiles.TMA_CONFIGS.values()}
    for plan in rec.launches:
        match = [(f, body) for f, body in built if plan["name"] == f"w8a8_{f[:-3]}_{body}"]
        assert len(match) == 1, f"launch {plan['name']} matches no compiled body"
        names = tuple(k for k, _ in plan["template"])
        assert names in built[match[0]], (plan["name"], names, built[match[0]])
        ints = tuple((k, v) for k, v in plan["template"] if k in ("BM", "BN", "WTM", "WTN", "STAGES", "PW", "PP", "ACC"))
        if ints:
            assert ints in tiles, (plan["name"], ints)
        body = plan["source"]
        for arg in plan["inputs"] + plan["outputs"]:
            assert re.search(rf"\b{arg}\b", body), f"{plan['name']}: body never uses {arg!r}"
        tg, grid = plan["threadgroup"][0], plan["grid"][0]
        assert tg % 32 == 0 and 32 <= tg <= 1024 and grid % 32 == 0, (plan["name"], tg, grid)
        assert plan["shared_memory"] <= 227 * 1024, (plan["name"], plan["shared_memory"])
        assert "//" not in body, "comments reach MLX (hashed on every launch)"
        # The header reaches MLX as one #include of a file holding exactly load()'s
        # header, the text the compile test above builds.
        include = re.fullmatch(r'#include "([^"]+)"\n', plan["header"])
        assert include, (plan["name"], plan["header"][:80])
        file = next(f for f, body in built if plan["name"] == f"w8a8_{f[:-3]}_{body}")
        with open(include.group(1), encoding="utf-8") as f:
            assert f.read() == launch.load(file)[0], (plan["name"], include.group(1))
        if plan["name"].startswith("w8a8_gemm_ws_"):
            # 8 consumer warps + PW producer warps, within gemm_ws.cu's
            # __launch_bounds__(384, 1); a persistent grid of at most one block per SM.
            pw = dict(plan["template"])["PW"]
            assert tg == 256 + 32 * pw <= 384, (plan["name"], tg, pw)
            assert grid // tg <= launch.SMS, (plan["name"], grid)
    ws_grids = [p["grid"][0] // p["threadgroup"][0] for p in rec.launches
                if p["name"] == "w8a8_gemm_ws_int32"]
    assert launch.SMS in ws_grids, "a persistent grid larger than the SM count was never capped"


def _spec_fields(spec):
    """A launch spec as comparable values: kernel name, the tail's arrays (by identity,
    or by value for a float32 bias converted anew), template, shapes, grid, block."""
    import mlx.core as mx

    tail = [("same", id(a)) if a.dtype != mx.float32 or a.ndim != 1 else
            ("value", tuple(np.array(a).tolist())) for a in spec.tail]
    return (spec.kernel.name, tail, spec.template, spec.output_shapes, spec.output_dtypes,
            spec.grid, spec.threadgroup)


def test_specs_of_one_shape_share_a_frame_and_take_their_own_weights(monkeypatch):
    """Layers of one shape build each new input shape's launch once (the launch code's
    ``_*_frame`` caches) and put in their own arrays: every spec equals the one built
    with the caches empty, for weights of one shape with and without a bias, their
    sibling launches, the grouped format, and the quantize. A frame cached without
    the bias in its key, or a spec keeping the frame's first weights, fails this."""
    import mlx.core as mx

    from mlx_w8a8.weight import QuantizedWeight

    rec = record_launches(monkeypatch)
    rng = np.random.default_rng(5)
    k, lead = 256, (1, 40)
    m = 40

    def weight(n, per_channel=True):
        w = mx.array(rng.standard_normal((n, k)).astype(np.float32)).astype(mx.bfloat16)
        return QuantizedWeight.from_float(w, 64, per_channel=per_channel)

    def bias(n):
        return mx.array(rng.standard_normal(n).astype(np.float32)).astype(mx.bfloat16)

    ws = cuda_tiles.WS_CONFIGS["ws128p4"]
    w1, w2, w3 = weight(96), weight(96), weight(32)
    g1, g2 = weight(96, False), weight(96, False)
    b1, b2 = bias(96), bias(32)
    builds = [
        lambda: cuda_gemm.gemm_per_channel_spec(m, k, w1, None, mx.bfloat16, ws, True, lead),
        lambda: cuda_gemm.gemm_per_channel_spec(m, k, w2, None, mx.bfloat16, ws, True, lead),
        lambda: cuda_gemm.gemm_per_channel_spec(m, k, w2, b1, mx.bfloat16, ws, True, lead),
        lambda: cuda_gemm.gemm_per_channel_spec(m, k, w1, None, mx.bfloat16, None, False, lead),
        lambda: cuda_gemm_ws.gemm_ws_group_spec(m, k, [(w1, None), (w3, None)], mx.bfloat16, ws, lead),
        lambda: cuda_gemm_ws.gemm_ws_group_spec(m, k, [(w2, b1), (w3, b2)], mx.bfloat16, ws, lead),
        lambda: cuda_gemm_grouped.gemm_grouped_spec(m, g1, None, mx.bfloat16, None, lead),
        lambda: cuda_gemm_grouped.gemm_grouped_spec(m, g2, b1, mx.bfloat16, None, lead),
        lambda: cuda_quantize.quantize_spec(m, k, mx.bfloat16, None, True, False, lead),
    ]

    def clear():
        launch._kernel.cache_clear()
        clear_frames()

    clear()
    try:
        framed = [_spec_fields(b()) for b in builds]  # each after the ones before it
        fresh = []
        for b in builds:
            clear()
            fresh.append(_spec_fields(b()))
    finally:
        clear()
    for i, (got, want) in enumerate(zip(framed, fresh)):
        assert got == want, (i, got, want)
    # the first two per-channel specs shared one frame (one kernel, one template list)
    assert framed[0][0] == framed[1][0] and framed[0][1] != framed[1][1]
    assert rec is not None


def test_per_channel_path_follows_the_unsigned_k_bound(monkeypatch):
    """The registered per-channel linear multiplies the unsigned codes (``channel_u8``,
    quantize with row sums) while K * 127 * 255 < 2^31 and flips them above (``channel``)."""
    import mlx.core as mx

    from mlx_w8a8.weight import QuantizedWeight

    assert launch.U8_MAX_K * 127 * 255 < 2**31 <= (launch.U8_MAX_K + 1) * 127 * 255
    rec = record_launches(monkeypatch)
    launch._kernel.cache_clear()
    try:
        for k in (4096, 66304, 66336):
            w = QuantizedWeight.from_int8(mx.zeros((8, k), dtype=mx.int8), mx.ones((8,)), 32)
            start = len(rec.launches)
            registry.get("linear", "cuda_w8a8_gemm").run(mx.zeros((2, k), dtype=mx.bfloat16),
                                                         w, None)
            names = [plan["name"] for plan in rec.launches[start:]]
            if k <= launch.U8_MAX_K:
                assert names == ["w8a8_quantize_rowsum", "w8a8_gemm_channel_u8"], (k, names)
            else:
                assert names == ["w8a8_quantize_plain", "w8a8_gemm_channel"], (k, names)
    finally:
        launch._kernel.cache_clear()


def test_stages_launch_what_run_launches(monkeypatch):
    """Each CUDA linear candidate's two-stage form, recorded on CPU arrays: apply(quantize
    (x)) makes the same launches (kernel, template, grid, input shapes) as run(x); equal
    act_keys come from quantize launches with the same outputs; the one-launch GEMV and the
    dequantizing GEMM (no quantize launch) have no stages, the two-launch GEMV has."""
    import mlx.core as mx

    from mlx_w8a8.kernels import registry
    from mlx_w8a8.kernels.registry import Problem
    from mlx_w8a8.weight import QuantizedWeight

    def summary(plans):
        return [(p["name"], p["template"], p["grid"], [a.shape for a in p["arrays"]])
                for p in plans]

    rec = record_launches(monkeypatch)
    monkeypatch.setattr(launch, "is_sm90", lambda: True)  # the ws candidates' supports()
    launch._kernel.cache_clear()
    w = mx.random.normal((264, 8192)).astype(mx.bfloat16)  # bfloat16 scales: every candidate runs
    quantize_launches = {}
    try:
        for cand in registry.all_candidates():
            if cand.backend != "cuda" or cand.op != "linear":
                continue
            assert cand.stages is not None, f"{cand.name} has no two-stage form"
            for m, k, fmt in ((16, 8192, "per_channel"), (16, 8192, "grouped"),
                              (2, 1024, "per_channel"), (300, 1024, "per_channel"),
                              (16, 8192, "grouped4"), (2, 1024, "grouped4")):
                problem = Problem("linear", m, 264, k, "bfloat16", fmt, 64, False)
                if not cand.supports(problem):
                    continue
                x = mx.zeros((m, k), dtype=mx.bfloat16)
                weight = QuantizedWeight.from_float(w[:, :k], 64, per_channel=fmt == "per_channel",
                                                    bits=4 if fmt == "grouped4" else 8)
                staged = cand.stages(problem)
                if cand.name in ("cuda_int8_gemv", "cuda_w4a8_gemv") and cuda_gemv.gemv_fuses(m, k):
                    assert staged is None, (cand.name, m, k)
                if staged is None:  # x taken as it is: the fused GEMV, the dequantizing GEMM
                    definition = next(d for d in cuda.KERNELS if d.name == cand.name)
                    assert definition.activations(problem) == (None, None), (cand.name, m, k)
                    continue
                key, quant, apply = staged
                start = len(rec.launches)
                cand.run(x, weight, None)
                direct = summary(rec.launches[start:])
                start = len(rec.launches)
                acts = quant(x)
                first = summary(rec.launches[start:])
                apply(acts, weight, None, x.dtype)
                both = summary(rec.launches[start:])
                assert both == direct, (cand.name, m, k, both, direct)
                outs = [(a.shape, a.dtype) for a in acts if a is not None]
                quantize_launches.setdefault((key, m, k), set()).add(repr(outs))
                assert len(first) == 1 and "quantize" in first[0][0], (cand.name, first)
    finally:
        launch._kernel.cache_clear()
    for (key, m, k), outs in quantize_launches.items():
        assert len(outs) == 1, f"act_key {key} names different activation formats: {outs}"
    keys = {key for key, _, _ in quantize_launches}
    assert cuda_quantize.ROWSUM in keys and cuda_quantize.PLAIN in keys


# Bound launches (Candidate.bind_stages) ---------------------------------------------------
def _same_launches(got, want) -> list[str]:
    """Where two recorded launch lists differ: every recorded argument, the input arrays by
    identity or else by shape, dtype and value (a bias is converted to float32 anew)."""
    import mlx.core as mx

    if len(got) != len(want):
        return [f"{len(got)} launches vs {len(want)}: {[g['name'] for g in got]} vs "
                f"{[w['name'] for w in want]}"]
    diffs = []
    for i, (g, w) in enumerate(zip(got, want)):
        for key in w:
            if key == "arrays":
                if len(g[key]) != len(w[key]):
                    diffs.append(f"launch {i} {w['name']}: {len(g[key])} inputs vs {len(w[key])}")
                    continue
                for j, (a, b) in enumerate(zip(g[key], w[key])):
                    if a is not b and (a.shape != b.shape or a.dtype != b.dtype
                                       or not mx.array_equal(a, b).item()):
                        diffs.append(f"launch {i} {w['name']}: input {j} differs")
            elif g[key] != w[key]:
                diffs.append(f"launch {i} {w['name']}: {key} {g[key]!r} vs {w[key]!r}")
    return diffs


def _bound_cases(rng):
    """(problem, weight, bias) covering the CUDA linear candidates' launch choices; each
    candidate takes those its supports() accepts."""
    import mlx.core as mx

    from mlx_w8a8.kernels.registry import Problem
    from mlx_w8a8.weight import QuantizedWeight

    dtypes = ("bfloat16", "float16", "float32")

    def weight(n, k, fmt, gs, wdtype):
        w = mx.array(rng.standard_normal((n, k)).astype("float32")).astype(wdtype)
        return QuantizedWeight.from_float(w, gs, per_channel=fmt == "per_channel")

    n, k = 1024, 256  # 1024 columns: M = 2048 reaches the 128 x 256 tile's 48-block rule
    weights = {"per_channel": weight(n, k, "per_channel", 64, mx.float32),
               "grouped": weight(n, k, "grouped", 64, mx.float16)}
    i = 0
    # M = 1 (fused GEMV, bucket 1), 3 (bucket 4), 16 (the largest GEMV bucket), 128 and
    # 2048 (GEMM tiles small/medium and large or wgmma).
    for m in (1, 3, 16, 128, 2048):
        for fmt, qw in weights.items():
            for has_bias in (False, True):
                dtype = dtypes[i % 3]
                i += 1
                bias = (mx.array(rng.standard_normal(n).astype("float32")).astype(
                    getattr(mx, dtypes[i % 3])) if has_bias else None)
                yield Problem("linear", m, n, k, dtype, fmt, 64, has_bias), qw, bias
    # K = 8192 at M = 16: the GEMV's x no longer fits shared memory (two launches).
    wide = {"per_channel": weight(64, 8192, "per_channel", 128, mx.bfloat16),
            "grouped": weight(64, 8192, "grouped", 128, mx.bfloat16)}
    for fmt, qw in wide.items():
        yield Problem("linear", 16, 64, 8192, "bfloat16", fmt, 128, False), qw, None
    # Either side of U8_MAX_K = 66311: the per-channel GEMM multiplies unsigned codes up to
    # it and flips them (plain quantize) above; the grouped GEMM and the two-launch GEMV
    # at group size 32.
    for k in (66304, 66336):
        for fmt in ("per_channel", "grouped"):
            qw = weight(8, k, fmt, 32, mx.float32)
            yield Problem("linear", 2, 8, k, "float16", fmt, 32, True), qw, mx.zeros((8,))
    # MLX's 4-bit weights (the 4-bit form of the group-wise TMA GEMM), with and without bias.
    w4 = QuantizedWeight.from_float(mx.array(rng.standard_normal((n, 256)).astype("float32")),
                                    64, per_channel=False, bits=4)
    for m, has_bias in ((1, True), (3, False), (16, True), (128, False), (2048, True)):
        yield (Problem("linear", m, n, 256, "bfloat16", "grouped4", 64, has_bias), w4,
               mx.zeros((n,)) if has_bias else None)
    # ... and the 4-bit GEMV's two-launch form (x too large for shared memory)
    w4 = QuantizedWeight.from_float(mx.array(rng.standard_normal((64, 8192)).astype("float32")),
                                    128, per_channel=False, bits=4)
    yield Problem("linear", 16, 64, 8192, "float16", "grouped4", 128, False), w4, None


def test_bound_launch_replays_its_trace_on_each_calls_inputs():
    """LaunchSpec.bound, with MLX's real mx.compile and a kernel object that computes
    from what it is given: the first call launches directly (the kernel gets the
    caller's own arrays: no trace, which a shape met once would never repay), the
    second traces, and every later call replays that launch on its own activations
    (outputs follow each call's x, not the first's); the tail reaches the kernel as a
    traced input, never as the captured array (mx.compile would re-run a captured lazy
    array's graph on every call); with compilation off each call launches directly."""
    import mlx.core as mx

    calls = []

    def kernel(*, inputs, output_shapes, output_dtypes, grid, threadgroup, template):
        calls.append(list(inputs))
        total = inputs[0]
        for t in inputs[1:]:
            total = total + t
        return [total, inputs[0] * 2]

    tail = (mx.array([10.0, 20.0]), mx.array([1.0, 1.0]) * 3)  # the second one lazy
    spec = launch.LaunchSpec(kernel, tail, [("T", mx.float32)], [(2,), (2,)],
                             [mx.float32, mx.float32], (32, 1, 1), (32, 1, 1))
    first, both = spec.bound(slice(1)), spec.bound()
    for i, v in enumerate((1.0, 5.0, -2.0, 7.0)):
        x = mx.array([v, v])
        (y,) = first(x)
        assert y.tolist() == [v + 13, v + 23]
        if i == 0:  # made directly: the kernel saw x itself and the tail's own arrays
            assert calls[-1][0] is x and calls[-1][1] is tail[0] and calls[-1][2] is tail[1]
        y, doubled = both(mx.array([v, 0.5]))
        assert y.tolist() == [v + 13, 23.5] and doubled.tolist() == [2 * v, 1.0]
        if i == 0:
            assert len(calls) == 2
    # 2 direct launches, then 2 traces (MLX 0.32.4 traces the first compiled function
    # of a process twice), then replays only
    assert len(calls) in (4, 5), f"{len(calls)} kernel calls for 2 bound launchers x 4 calls"
    assert not any(a is t for args in calls[2:] for a in args for t in tail), "tail captured"
    traced = len(calls)
    mx.disable_compile()
    try:
        first(mx.array([0.0, 0.0]))
        first(mx.array([0.0, 0.0]))
    finally:
        mx.enable_compile()
    assert len(calls) == traced + 2


def test_bound_forms_launch_what_run_launches(monkeypatch, rng):
    """Each CUDA linear candidate's bound form (bind_stages), on every case it supports:
    apply(quantize(x)) (or apply(x) with one stage) makes exactly the launches run(x, w, b)
    and the unbound apply(quantize(x), w, b, dtype) make, in the same order, with every
    recorded argument equal (kernel, source, template, inputs, output shapes and dtypes,
    grid, threadgroup, shared memory), also on a second call; act_key is stages' key."""
    import mlx.core as mx

    from mlx_w8a8.kernels import registry

    rec = record_launches(monkeypatch)
    monkeypatch.setattr(launch, "is_sm90", lambda: True)  # the ws candidates' supports()
    names = ["cuda_w8a8_gemm", "cuda_w8a8_gemm_ws", "cuda_w8a8_gemm_tma", "cuda_w8a8_gemm_grouped",
             "cuda_w8a8_gemm_grouped_tma", "cuda_w4a8_gemm_tma", "cuda_act_groups_gemm_tma",
             "cuda_w8a8_gemm_subnormal", "cuda_w4a8_gemm_subnormal",
             "cuda_int8_gemv", "cuda_int8_gemv_mma", "cuda_w4a8_gemv", "cuda_w4a8_gemv_mma",
             "cuda_dequant_gemm", "cuda_dequant_matmul"]
    linear = [c for c in registry.all_candidates() if c.backend == "cuda" and c.op == "linear"]
    assert sorted(c.name for c in linear) == sorted(names)
    cases = list(_bound_cases(rng))
    checked, bodies = {n: 0 for n in names}, set()
    launch._kernel.cache_clear()
    try:
        for sm90 in (False, True):  # the 128 x 256 tile as mma.sync, then as wgmma
            monkeypatch.setattr(launch, "is_sm90", lambda: sm90)
            for cand in linear:
                assert cand.bind_stages is not None, f"{cand.name} has no bound form"
                for problem, qw, bias in cases:
                    if not cand.supports(problem):
                        continue
                    x = mx.zeros((problem.m, problem.k), dtype=getattr(mx, problem.dtype))
                    start = len(rec.launches)
                    cand.run(x, qw, bias)
                    direct = rec.launches[start:]
                    staged = cand.stages(problem)
                    start = len(rec.launches)
                    if staged is not None:
                        staged[2](staged[1](x), qw, bias, x.dtype)
                    two_stage = rec.launches[start:]
                    key, quantize, apply = cand.bind_stages(problem, qw, bias)
                    assert key == (None if staged is None else staged[0]), (cand.name, problem)
                    assert (quantize is None) == (staged is None), (cand.name, problem)
                    for _ in range(2):  # the closures are reused: the same launches again
                        start = len(rec.launches)
                        y = apply(x) if quantize is None else apply(quantize(x))
                        bound = rec.launches[start:]
                        where = (cand.name, problem, bias is not None and bias.dtype)
                        assert not _same_launches(bound, direct), (where, _same_launches(bound, direct))
                        if staged is not None:
                            assert not _same_launches(bound, two_stage), where
                        assert y.shape == (problem.m, problem.n) and y.dtype == x.dtype, where
                    checked[cand.name] += 1
                    bodies.update(p["name"] for p in bound)
    finally:
        launch._kernel.cache_clear()
    assert all(checked.values()), checked
    # The cases reach every launch shape a linear candidate has.
    for body in ("w8a8_quantize_rowsum", "w8a8_quantize_plain", "w8a8_quantize_sums",
                 "w8a8_gemm_channel_u8", "w8a8_gemm_channel_u8_bias", "w8a8_gemm_channel_bias",
                 "w8a8_gemm_wgmma_channel_u8", "w8a8_gemm_ws_channel_u8_bias",
                 "w8a8_gemm_ws_tma_channel_u8", "w8a8_gemm_ws_tma_channel_u8_bias",
                 "w8a8_gemm_grouped", "w8a8_gemm_grouped_bias",
                 "w8a8_gemm_grouped_ws_tma_grouped", "w8a8_gemm_grouped_ws_tma_grouped_bias",
                 "w8a8_gemm_grouped_ws_tma_groupwise", "w8a8_gemm_grouped_ws_tma_groupwise_bias",
                 "w8a8_quantize_groups",
                 "w8a8_gemv_fused_channel",
                 "w8a8_gemv_fused_grouped_bias", "w8a8_gemv_channel", "w8a8_gemv_grouped_bias",
                 "w8a8_gemv_fused_grouped4", "w8a8_gemv_fused_grouped4_bias",
                 "w8a8_gemv_grouped4", "w8a8_gemm_dequant_dequant", "w8a8_gemv_mma_channel",
                 "w8a8_gemv_mma_grouped_bias", "w8a8_gemv_mma_grouped4",
                 "w8a8_gemm_dequant_dequant_bias", "w8a8_dequantize_dequantize"):
        assert body in bodies, (body, sorted(bodies))


@pytest.fixture
def cuda_here(monkeypatch):
    """The CUDA candidates offered as on a Hopper GPU, launches recorded (no GPU needed)."""
    import attrs

    from mlx_w8a8.kernels import registry

    rec = record_launches(monkeypatch)
    monkeypatch.setattr(launch, "is_sm90", lambda: True)
    originals = [c for c in registry.all_candidates() if c.backend == "cuda"]
    launch._kernel.cache_clear()
    for c in originals:
        registry.register(attrs.evolve(c, available=lambda: True))
    try:
        yield rec
    finally:
        for c in originals:
            registry.register(c)
        launch._kernel.cache_clear()


# (candidate, weight format, x shape): 3-D x is flattened by the layer; [1, 1, K] is a
# decode step, [2, 64, K] a prefill; K = 8192 at M = 16 takes the two-launch GEMV.
_LAYER_CASES = [
    ("cuda_w8a8_gemm", "per_channel", (2, 64, 256)),
    ("cuda_w8a8_gemm_ws", "per_channel", (128, 256)),
    ("cuda_w8a8_gemm_tma", "per_channel", (2, 64, 256)),
    ("cuda_w8a8_gemm_grouped", "grouped", (2, 64, 256)),
    ("cuda_w8a8_gemm_grouped_tma", "grouped", (2, 64, 256)),
    ("cuda_int8_gemv", "per_channel", (1, 1, 256)),
    ("cuda_int8_gemv", "grouped", (16, 8192)),
    ("cuda_w4a8_gemv", "grouped4", (1, 1, 256)),
    ("cuda_w4a8_gemv", "grouped4", (16, 8192)),
    ("cuda_act_groups_gemm_tma", "grouped", (2, 64, 256)),  # act_scales="group"
]


@pytest.mark.parametrize("name,fmt,shape", _LAYER_CASES)
def test_linear_prepares_cuda_launches_once(cuda_here, monkeypatch, rng, name, fmt, shape):
    """A Linear whose decision is a CUDA candidate builds its launch arguments on its
    first two calls at a shape only: over 5 calls each launch spec is built twice (the
    first call's plan runs once and is dropped, the second's is kept: plans.PlanCache.keep),
    and every call makes the launches of run(x, w, b). Replacing the arrays (as mx.compile(inputs=state) does,
    without __setitem__) binds again to the new arrays; a bias set through the module
    re-decides."""
    import mlx.core as mx
    import numpy as np

    import mlx_w8a8 as w8
    from mlx_w8a8.kernels import registry
    from mlx_w8a8.weight import QuantizedWeight

    rec = cuda_here
    built = []
    for spec in ("quantize_spec", "quantize_act_groups_spec", "gemm_per_channel_spec",
                 "gemm_grouped_spec", "gemm_grouped_tma_spec", "gemv_fused_spec",
                 "gemv_quantized_spec"):
        # in every family module that names it (the definitions import it by name)
        for module in (cuda_quantize, cuda_gemm, cuda_gemm_ws, cuda_gemm_grouped, cuda_gemv):
            real = getattr(module, spec, None)
            if real is not None:
                monkeypatch.setattr(module, spec, lambda *a, _real=real, _name=spec, **kw:
                                    built.append(_name) or _real(*a, **kw))
    k = shape[-1]
    w = mx.array(rng.standard_normal((96, k)).astype(np.float32))
    qw = QuantizedWeight.from_float(w, 64, per_channel=fmt == "per_channel",
                                    bits=4 if fmt == "grouped4" else 8)
    layer = w8.Linear.from_weight(qw,
                                  mx.array(rng.standard_normal(96).astype(np.float32)))
    if name == "cuda_act_groups_gemm_tma":
        layer.act_scales = "group"
    layer.kernel = name
    per_call = []
    for _ in range(5):  # a new x each call: the same x would reuse its quantized activations
        x = mx.zeros(shape, dtype=mx.bfloat16)
        start = len(rec.launches)
        y = layer(x)
        per_call.append(rec.launches[start:])
    assert y.shape == (*shape[:-1], 96) and y.dtype == mx.bfloat16
    launches = len(per_call[0])
    assert launches in (1, 2), built
    assert collections.Counter(built) == collections.Counter({n: 2 for n in built}), built
    assert len(built) == 2 * launches, f"launch specs built {len(built)} times for {launches} launch(es) per call x 5: {built}"
    x2 = x.reshape(-1, k)
    start = len(rec.launches)
    registry.get("linear", name).run(x2, layer.quantized_weight, layer.bias)
    direct = rec.launches[start:]
    lead = tuple(shape[:-1])

    def flat(s):  # [*lead, d] -> [M, d]
        return (math.prod(lead), s[-1]) if tuple(s[:-1]) == lead and len(s) > 1 else tuple(s)

    for got in per_call:
        # x reaches the first launch as it is (no reshape node: the kernels read [..., K]),
        # and every activation-shaped input and output keeps the leading shape; flattened,
        # the launches are run()'s on [M, K].
        assert any(a.shape == shape for a in got[0]["arrays"]), [a.shape for a in got[0]["arrays"]]
        for plan in got:
            # (the activation array is [R, K] whatever the lead: cuda_quantize.rowsum_shape; the
            # group-wise TMA GEMM's group sums are flat: cuda_quantize.grouped_sums_shape)
            sums_map = name in ("cuda_w8a8_gemm_grouped_tma", "cuda_act_groups_gemm_tma")
            assert all(tuple(s[:-1]) == lead for s, out in zip(plan["output_shapes"], plan["outputs"])
                       if out != "xa" and not (sums_map and out in ("row_sums", "sums"))), plan["output_shapes"]
            assert all(tuple(s) == cuda_quantize.grouped_sums_shape(math.prod(lead), k, 64)
                       for s, out in zip(plan["output_shapes"], plan["outputs"])
                       if sums_map and out == "row_sums")
            assert all(tuple(s) == cuda_quantize.rowsum_shape(math.prod(lead), k)
                       for s, out in zip(plan["output_shapes"], plan["outputs"]) if out == "xa")
            plan["arrays"] = [a.reshape(flat(a.shape)) for a in plan["arrays"]]
            plan["output_shapes"] = [flat(s) for s in plan["output_shapes"]]
        assert not _same_launches(got, direct), _same_launches(got, direct)
    # New arrays without __setitem__ (mx.compile's state swap): the next call launches
    # on them (bound again once), later calls do not build again.
    built.clear()
    fresh = mx.array(np.array(layer.weight))
    dict.__setitem__(layer, "weight", fresh)
    for _ in range(3):
        start = len(rec.launches)
        layer(mx.zeros(shape, dtype=mx.bfloat16))
        assert any(a is fresh for p in rec.launches[start:] for a in p["arrays"])
    assert len(built) == launches, built
    # A bias replaced through the module forgets the plan: bound again with the new bias.
    built.clear()
    layer.bias = mx.ones((96,))
    start = len(rec.launches)
    layer(mx.zeros(shape, dtype=mx.bfloat16))
    assert len(built) == launches
    assert any(a.shape == (96,) and mx.all(a == 1).item() for p in rec.launches[start:]
               for a in p["arrays"])


def test_bound_layers_fed_one_input_quantize_it_once(cuda_here):
    """q/k/v-like Linears on CUDA candidates with the same act_key share one quantize
    launch of x through the bound forms; each still makes its own GEMM launch."""
    import mlx.core as mx

    import mlx_w8a8 as w8
    import mlx_w8a8.nn as w8nn

    rec = cuda_here
    layers = [w8.Linear(256, n) for n in (128, 64, 64)]
    for layer, name in zip(layers, ("cuda_w8a8_gemm", "cuda_w8a8_gemm_ws", "cuda_w8a8_gemm")):
        layer.kernel = name
    w8nn.clear_shared_activations()
    x = mx.zeros((2, 64, 256), dtype=mx.float16)
    for _ in range(2):  # the first call binds, the second reuses
        start = len(rec.launches)
        for layer in layers:
            layer(x)
        names = [p["name"] for p in rec.launches[start:]]
        assert names == ["w8a8_quantize_rowsum", "w8a8_gemm_channel_u8_bias",
                         "w8a8_gemm_ws_channel_u8_bias", "w8a8_gemm_channel_u8_bias"], names
        x = mx.zeros((2, 64, 256), dtype=mx.float16)  # a new array: quantized again


def test_kernel_names_change_with_their_text(monkeypatch):
    """MLX caches compiled kernels on disk by name alone: a kernel whose text changed (an
    upgrade of this package) must get a new name, or the old machine code would run."""
    rec = record_launches(monkeypatch)

    def name_of(file, body, inputs=("x",), outputs=("q", "scale")):
        launch._kernel.cache_clear()
        launch.load.cache_clear()
        try:
            launch._kernel(file, body, inputs, outputs)
        finally:
            launch._kernel.cache_clear()
            launch.load.cache_clear()
        return rec.builds[-1]["mlx_name"]

    first = name_of("quantize.cu", "plain")
    assert first == name_of("quantize.cu", "plain")  # stable across processes and calls
    assert first != name_of("quantize.cu", "rowsum")
    assert first != name_of("quantize.cu", "plain", outputs=("q", "s"))
    real = sources.read

    def edited(backend, filename):
        text = real(backend, filename)
        return text.replace("// @@ body plain", "// @@ body plain\n    (void)0;", 1) \
            if filename == "quantize.cu" else text

    monkeypatch.setattr(sources, "read", edited)
    assert name_of("quantize.cu", "plain") != first



def test_candidate_digests_follow_the_compiled_code_not_comments(monkeypatch):
    """A tuning table entry is fresh while its candidates' digests match
    (kernel.digest, derived from the code a definition reaches): a comment edited in a kernel file, or in a file it requires, must
    leave the digest as it was (the compiled text is the same), while a code edit, a
    body renamed or a required header's code changed must change it."""
    real = sources.read
    edits: dict[str, tuple[str, str]] = {}

    def edited(backend, filename):
        text = real(backend, filename)
        old, new = edits.get(filename, ("", ""))
        assert not old or old in text, (filename, old)
        return text.replace(old, new, 1) if old else text

    def digest():
        launch.load.cache_clear()
        launch.requires.cache_clear()
        try:
            return cuda_kernel.digest(cuda_gemm_ws.W8A8GemmWs)  # reaches gemm_ws.cu (and tma.cuh)
        finally:
            launch.load.cache_clear()
            launch.requires.cache_clear()

    monkeypatch.setattr(sources, "read", edited)
    base = digest()
    # (file, old text, new text, whether the digest must change)
    cases = {
        "comment line in the file": ("gemm_ws.cu", "namespace w8a8 {",
                                     "// a new remark\nnamespace w8a8 {", False),
        "comment after code": ("gemm_ws.cu", "namespace w8a8 {", "namespace w8a8 {  // remark",
                               False),
        "comment in a required header": ("tma.cuh", "namespace w8a8 {",
                                         "// remark\nnamespace w8a8 {", False),
        "code in the file": ("gemm_ws.cu", "namespace w8a8 {",
                             "namespace w8a8 {\nconstexpr int kUnused = 1;", True),
        "a body renamed": ("gemm_ws.cu", "// @@ body group2\n", "// @@ body group2x\n", True),
        "code in a required header": ("tma.cuh", "constexpr int kTmaMapBytes = 128;",
                                      "constexpr int kTmaMapBytes = 128;\nconstexpr int kX = 2;",
                                      True),
    }
    for what, (file, old, new, stales) in cases.items():
        edits.clear()
        edits[file] = (old, new)
        assert (digest() != base) == stales, what


# Kernel files: requirements and text ------------------------------------------------------
def test_digests_leave_out_the_registry_glue_and_the_gpu_probe():
    """A CUDA digest follows what a kernel launches, not how it is handed to the registry
    (``kernel.candidate``) or how a machine is probed for a GPU (``launch.cuda_available``,
    the candidates' ``available``): neither is reached from a definition class, so editing
    them leaves every tuning table fresh. The registered candidate's ``available`` is
    still the probe."""
    for k in cuda.KERNELS:
        reached = sources.closure((type(k),), cuda_kernel.DIGEST_MODULES)
        assert not [name for name in reached if name.endswith(
            (".cuda_available", ".candidate", ".digest", ".closure_digest"))], k.name
        assert registry.get(k.op, k.name).available is launch.cuda_available


def test_grouped_tma_digest_is_its_own(monkeypatch):
    """The group-wise TMA candidates' digests (the 8-bit one, its 4-bit and its
    activation-group forms, and the subnormal promotion's, whose file requires this one)
    follow their kernel file and the ws.cuh header it requires; a code edit in
    gemm_grouped_ws.cu leaves every other CUDA candidate's digest as it was (the
    shipped H200 table is keyed by those)."""
    real = sources.read
    edits: dict[str, tuple[str, str]] = {}

    def edited(backend, filename):
        text = real(backend, filename)
        old, new = edits.get(filename, ("", ""))
        return text.replace(old, new, 1) if old else text

    def digests():
        launch.load.cache_clear()
        launch.requires.cache_clear()
        try:
            return {k.name: cuda_kernel.digest(type(k)) for k in cuda.KERNELS}
        finally:
            launch.load.cache_clear()
            launch.requires.cache_clear()

    monkeypatch.setattr(sources, "read", edited)
    base = digests()
    name = "cuda_w8a8_gemm_grouped_tma"
    names = (name, "cuda_w4a8_gemm_tma", "cuda_act_groups_gemm_tma", "cuda_w8a8_gemm_subnormal",
             "cuda_w4a8_gemm_subnormal")
    assert len(set(base.values())) == len(base)  # (the autouse fake maps enter them all)
    edits["gemm_grouped_ws.cu"] = ("namespace w8a8 {", "namespace w8a8 {\nconstexpr int kX = 1;")
    after = digests()
    assert all(after[n] != base[n] for n in names)
    assert {k: v for k, v in after.items() if k not in names} == {
        k: v for k, v in base.items() if k not in names}
    edits.clear()
    edits["ws.cuh"] = ("namespace w8a8 {", "namespace w8a8 {\nconstexpr int kX = 1;")
    assert digests()[name] != base[name]


def test_requires_puts_each_shared_file_once_before_its_users():
    """gemm_ws.cu and gemm_wgmma.cu both need common.cuh, once through wgmma.cuh and once
    directly: the loader must put it first and once (twice would redefine everything)."""
    assert launch.requires("gemm_ws.cu") == ("shape.cuh", "common.cuh", "wgmma.cuh", "tma.cuh",
                                             "ws.cuh", "gemm_ws.cu")
    assert launch.requires("gemm_grouped_ws.cu") == ("shape.cuh", "common.cuh", "wgmma.cuh",
                                                     "tma.cuh", "ws.cuh", "gemm_grouped_ws.cu")
    # the group-wise kernel shares ws.cuh, not the per-channel kernel's own code
    assert "gemm_ws(" not in launch.load("gemm_grouped_ws.cu")[0]
    assert launch.requires("gemm_wgmma.cu") == ("shape.cuh", "common.cuh", "wgmma.cuh",
                                                 "gemm_wgmma.cu")
    assert launch.requires("gemm.cu") == ("shape.cuh", "common.cuh", "mma.cuh", "gemm.cu")
    assert launch.requires("gemv_mma.cu") == ("shape.cuh", "mma.cuh", "gemv.cuh", "gemv_mma.cu")
    assert launch.requires("gemv.cu") == ("shape.cuh", "quantize.cuh", "gemv.cuh", "gemv.cu")
    assert launch.requires("quantize.cu") == ("shape.cuh", "quantize.cuh", "quantize.cu")
    header, bodies = launch.load("gemm_ws.cu")
    assert header.count("struct ChannelEpilogue") == 1
    assert header.index("struct ChannelEpilogue") < header.index("wgmma_k32") < header.index("gemm_ws(")
    assert "mma_i8" not in header  # gemm.cu's mma.sync code is not carried by the ws kernels
    plain = {"int32", "channel_u8", "channel_u8_bias", "group2", "group2_bias", "group3",
             "group3_bias"}
    assert set(bodies) == plain | {"tma_" + b for b in plain}
    assert "quantize_row(" not in launch.load("gemv.cu")[0]  # only what the GEMV uses


def test_every_header_only_file_is_required_by_a_kernel_file():
    from importlib import resources

    folder = resources.files("mlx_w8a8").joinpath("shaders", "cuda")
    headers = {p.name for p in folder.iterdir() if p.name.endswith(".cuh")}
    kernels = {p.name for p in folder.iterdir() if p.name.endswith(".cu")}
    used = {f for k in kernels for f in launch.requires(k)}
    assert headers and headers <= used, headers - used


def test_requires_refuses_a_cycle(monkeypatch):
    texts = {"a.cu": "// @@ requires b.cuh\n// @@ body x\n;\n", "b.cuh": "// @@ requires a.cu\n"}
    monkeypatch.setattr(sources, "read", lambda backend, f: texts[f])
    launch.requires.cache_clear()
    try:
        with pytest.raises(ValueError, match="a.cu -> b.cuh -> a.cu"):
            launch.requires("a.cu")
    finally:
        launch.requires.cache_clear()


def _tma_long_k(m: int, n: int) -> "cuda_tiles.WsConfig":
    return cuda_tiles.tma_tile_for(m, n, cuda_tiles.PINGPONG_MAX_K + 16)


@pytest.mark.parametrize("tile_for,configs", [(cuda_tiles.ws_tile_for, cuda_tiles.WS_CONFIGS),
                                               (_tma_long_k, cuda_tiles.TMA_CONFIGS)])
def test_tile_choice_fills_the_sms(tile_for, configs):
    """The widest tile whose output has at least 0.8 x 132 tiles, else the narrowest
    (measured on an H200, docs/cuda.md; the Llama-3-8B shapes). The TMA rule at a K past
    the ping-pong bound, where it is this rule alone."""
    want = {(16, 4096): 32, (128, 4096): 32, (128, 1024): 32, (128, 14336): 128,
            (512, 4096): 128, (512, 1024): 32, (512, 14336): 256, (2048, 4096): 256,
            (2048, 1024): 128, (1, 128256): 256, (8, 28672): 256, (128, 6144): 32}
    for (m, n), bn in want.items():
        cfg = tile_for(m, n)
        assert cfg.bn == bn and cfg in configs.values(), (m, n, cfg)
        wider = [c for c in configs.values() if c.bn > cfg.bn]
        assert all(cuda_tiles.tiles(m, n, c) < cuda_tiles.WAVE_FILL * launch.SMS for c in wider)
    assert tile_for(1, 40).bn == 32  # nothing fills: the most tiles


def test_dequant_tile_fills_the_sms_without_rows_past_m():
    """The dequantizing GEMM's token tile (128 features x bn tokens): no wider than M
    (64 always allowed: a wider tile's MMAs multiply rows that are not there), then the
    widest that fills the SMs, else the narrowest (the H100 timings of docs/cuda.md: at
    M = 512, 256 tokens on N = 14336 and 128 on N = 4096)."""
    want = {(1, 14336): 64, (64, 128256): 64, (128, 14336): 128, (200, 4096): 64,
            (256, 14336): 256, (512, 4096): 128, (512, 14336): 256, (512, 1024): 64,
            (2048, 1024): 128, (2048, 4096): 256}
    for (m, n), bn in want.items():
        cfg = cuda_tiles.dequant_tile_for(m, n)
        assert cfg.bn == bn and cfg in cuda_tiles.DEQUANT_CONFIGS.values(), (m, n, cfg)
        assert cfg.bn <= max(m, 64)
        wider = [c for c in cuda_tiles.DEQUANT_CONFIGS.values() if cfg.bn < c.bn <= m]
        assert all(cuda_tiles.tiles(n, m, c) < cuda_tiles.WAVE_FILL * launch.SMS for c in wider)


def test_tma_tile_takes_ping_pong_for_the_wide_tile_up_to_its_k_bound():
    """Where the fill rule gives the cooperative 128 x 256 tile, K <= PINGPONG_MAX_K takes
    the ping-pong 128 x 128 one (measured faster at K = 4096, slower at 14336:
    docs/cuda.md); where a 128 x 128 grid has at most one tile per block (SMS), its
    consumers are cooperative (tma128: a ping-pong block's second warpgroup would have
    no tile; NVIDIA H200, 2026-12-01); every other choice is the fill rule's at any K."""
    bound = cuda_tiles.PINGPONG_MAX_K
    pp, coop = cuda_tiles.TMA_CONFIGS["tma128pp"], cuda_tiles.TMA_CONFIGS["tma128"]
    assert pp.pingpong and pp.bn == 128 and not coop.pingpong and coop.bn == 128
    for m, n in ((512, 14336), (2048, 4096), (2048, 28672), (8, 28672), (1, 128256)):
        assert _tma_long_k(m, n).bn == 256
        assert cuda_tiles.tma_tile_for(m, n, bound) == pp
        assert cuda_tiles.tma_tile_for(m, n, 4096) == pp
        assert cuda_tiles.tma_tile_for(m, n, bound + 16).bn == 256
    for m, n in ((16, 4096), (512, 1024), (128, 4096)):
        assert cuda_tiles.tma_tile_for(m, n, 4096) == _tma_long_k(m, n)
        assert cuda_tiles.tma_tile_for(m, n, 4096).bn < 128
    # One 128 x 128 tile per block or fewer: cooperative at any K; one more: ping-pong.
    for m, n in ((128, 14336), (512, 4096), (512, 3584), (2048, 1024), (128, 132 * 128)):
        assert cuda_tiles.tiles(m, n, coop) <= launch.SMS
        for k in (4096, bound + 16):
            assert cuda_tiles.tma_tile_for(m, n, k) == coop, (m, n, k)
    assert cuda_tiles.tma_tile_for(128, 133 * 128, 4096) == pp
    assert cuda_tiles.tma_tile_for(128, 18944, 3584) == pp  # 148 tiles
    assert cuda_tiles.tma_tile_for(512, 1024, 4096) != coop  # the fill rule's narrow tile


def test_linked_siblings_make_one_quantize_and_one_group_launch(cuda_here):
    """q/k/v linked by mlx_w8a8.quantize, the warp-specialized GEMM chosen: the first
    member called makes the quantize launch and one group3 launch with every member's
    weight and an output per member; the other members launch nothing. x reaches the
    quantize launch as it is ([B, L, K]); the outputs keep the leading shape."""
    import mlx.core as mx
    import mlx.nn as nn

    import mlx_w8a8 as w8
    from mlx_w8a8 import siblings
    from mlx_w8a8.kernels import registry

    rec = cuda_here

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(256, n, bias=False)
                                                     for n in (256, 64, 64))

    attn = Attention()
    w8.quantize(attn)
    ws = registry.get("linear", "cuda_w8a8_gemm_ws")
    previous = registry.set_chooser(lambda problem, found: (ws, "test") if ws in found else None)
    try:
        siblings.clear()
        for _ in range(2):  # bound on the first call, reused on the second
            x = mx.zeros((2, 64, 256), dtype=mx.bfloat16)
            start = len(rec.launches)
            outs = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)]
            plans = rec.launches[start:]
            assert [p["name"] for p in plans] == ["w8a8_quantize_rowsum", "w8a8_gemm_ws_group3"]
            assert plans[0]["arrays"][0] is x
            group = plans[1]
            assert group["outputs"] == ["y0", "y1", "y2"]
            assert group["output_shapes"] == [(2, 64, 256), (2, 64, 64), (2, 64, 64)]
            weights = [a for a in group["arrays"] if a.dtype == mx.uint32]
            assert [w is layer.weight for w, layer in
                    zip(weights, (attn.q_proj, attn.k_proj, attn.v_proj))] == [True] * 3
            assert [y.shape for y in outs] == [(2, 64, 256), (2, 64, 64), (2, 64, 64)]
            # one persistent grid over every member's tiles: 1 row tile x (8 + 2 + 2) tiles
            # of 128 x 32 (the summed N = 384 has 12 of them, fewer than fill the SMs)
            assert cuda_tiles.ws_tile_for(128, 384).bn == 32
            assert group["grid"][0] // group["threadgroup"][0] == 12
    finally:
        registry.set_chooser(previous)


def _quantized_mlp(k: int, n: int):
    """gate/up projections (K -> N, no bias) converted by mlx_w8a8.quantize, which links
    them as siblings: what the sibling-launch tests drive."""
    import mlx.nn as nn

    import mlx_w8a8 as w8

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(k, n, bias=False), nn.Linear(k, n, bias=False)

    mlp = Mlp()
    w8.quantize(mlp)
    return mlp


@contextlib.contextmanager
def _gemv_chosen():
    """Every problem cuda_int8_gemv takes decides it (source "test"), until the end."""
    gemv = registry.get("linear", "cuda_int8_gemv")
    previous = registry.set_chooser(lambda problem, found: (gemv, "test") if gemv in found else None)
    try:
        yield gemv
    finally:
        registry.set_chooser(previous)


def test_linked_siblings_decode_as_one_fused_gemv_launch(cuda_here):
    """gate/up linked, the GEMV chosen: at a decode step ([1, 1, K]) the first member
    called makes one fused_channel_group2 launch (x quantized inside it: no quantize
    launch) with both weights, x as it is and an output per member; the second member
    launches nothing. Its grid deals the summed rows as one weight's would be dealt. Where
    x does not fit the fused kernel (M = 16, K = 8192) the group shares one quantize
    launch and each member launches its own GEMV."""
    import mlx.core as mx

    from mlx_w8a8 import siblings

    rec = cuda_here

    with _gemv_chosen():
        mlp = _quantized_mlp(256, 1000)
        siblings.clear()
        for _ in range(2):  # bound on the first call, reused on the second
            x = mx.zeros((1, 1, 256), dtype=mx.bfloat16)
            start = len(rec.launches)
            outs = [mlp.gate_proj(x), mlp.up_proj(x)]
            plans = rec.launches[start:]
            assert [p["name"] for p in plans] == ["w8a8_gemv_fused_channel_group2"]
            assert plans[0]["arrays"][0] is x
            assert plans[0]["outputs"] == ["y0", "y1"]
            weights = [a for a in plans[0]["arrays"] if a.dtype == mx.uint32]
            assert [w is layer.weight for w, layer in
                    zip(weights, (mlp.gate_proj, mlp.up_proj))] == [True, True]
            assert [y.shape for y in outs] == [(1, 1, 1000), (1, 1, 1000)]
            # 2 x 250 steps of RW = 4 rows: 500 warps, 63 blocks of 8 (the 1000-row weight
            # alone: 250 warps, 32 blocks)
            assert plans[0]["grid"][0] // plans[0]["threadgroup"][0] == 63
        assert mlp.gate_proj.decision(1)[1] == "test+siblings"

        big = _quantized_mlp(8192, 64)
        x = mx.zeros((16, 8192), dtype=mx.bfloat16)
        start = len(rec.launches)
        outs = [big.gate_proj(x), big.up_proj(x)]
        assert [p["name"] for p in rec.launches[start:]] == [
            "w8a8_quantize_plain", "w8a8_gemv_channel", "w8a8_gemv_channel"]
        assert [y.shape for y in outs] == [(16, 64), (16, 64)]


def test_linked_siblings_with_outlier_channels_launch_once_on_the_masked_input(cuda_here):
    """gate/up linked with the same outlier channels: the first member's call makes the
    one fused group launch on the masked x (not x itself: the channels are zeroed before
    the kernel quantizes), the second member launches nothing and takes its output; with
    different channels they are not one group and each launches by itself."""
    import mlx.core as mx

    from mlx_w8a8 import siblings

    rec = cuda_here

    with _gemv_chosen():
        mlp = _quantized_mlp(256, 1000)
        for layer in (mlp.gate_proj, mlp.up_proj):
            layer.outliers = (3, 77)
        siblings.clear()
        for _ in range(2):
            x = mx.zeros((1, 1, 256), dtype=mx.bfloat16)
            start = len(rec.launches)
            outs = [mlp.gate_proj(x), mlp.up_proj(x)]
            plans = rec.launches[start:]
            assert [p["name"] for p in plans] == ["w8a8_gemv_fused_channel_group2"]
            assert plans[0]["arrays"][0] is not x and plans[0]["arrays"][0].shape == x.shape
            assert [y.shape for y in outs] == [(1, 1, 1000), (1, 1, 1000)]
        mlp.up_proj.outliers = (3,)
        start = len(rec.launches)
        mx.eval(mlp.gate_proj(x), mlp.up_proj(x))
        assert [p["name"] for p in rec.launches[start:]] == ["w8a8_gemv_fused_channel"] * 2


def test_tma_launches_carry_each_weights_map_array(cuda_here):
    """The per-channel TMA bodies take one map array per weight (cuda_tma.weight_maps,
    512 bytes: A's prototype, [128, K] in 128-row boxes, the same at every M: the kernel
    writes M and min(M, 128) box rows into A's map, tma.cuh tma_make_map, checked on the
    GPU by tests/test_cuda.py's TMA tests at M = 1-2048; then the weight's, [N_g, K] in
    BN-row boxes; then room for the map every launch makes), in member order, and no
    output but the members' (a scratch output cost each launch about 2.7 us of host
    time). The array is made once per weight and tile width and kept with the weight:
    the same array at every M and in every launch. Single layer and q/k/v linked; M =
    300, 10 and 128 rows, on the 128 x 32 tile (one producer warp)."""
    import mlx.core as mx
    import mlx.nn as nn

    import mlx_w8a8 as w8
    from mlx_w8a8 import siblings
    from mlx_w8a8.kernels import registry

    rec = cuda_here

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(256, n, bias=False)
                                                     for n in (384, 64, 96))

    def maps_of(n):  # A's prototype, the weight's, then 256 bytes of room (zeros)
        return [(128, 256, 128), (n, 256, 32), (0, 0, 0), (0, 0, 0)]

    attn = Attention()
    w8.quantize(attn)
    tma = registry.get("linear", "cuda_w8a8_gemm_tma")
    previous = registry.set_chooser(lambda problem, found: (tma, "test") if tma in found else None)
    try:
        siblings.clear()
        x = mx.zeros((3, 100, 256), dtype=mx.bfloat16)
        start = len(rec.launches)
        outs = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)]
        assert [y.shape for y in outs] == [(3, 100, 384), (3, 100, 64), (3, 100, 96)]
        plans = rec.launches[start:]
        assert [p["name"] for p in plans] == ["w8a8_quantize_rowsum", "w8a8_gemm_ws_tma_group3"]
        group = plans[1]
        assert group["outputs"] == ["y0", "y1", "y2"]
        assert group["output_shapes"] == [(3, 100, 384), (3, 100, 64), (3, 100, 96)]
        assert group["inputs"][-3:] == ["wmap0", "wmap1", "wmap2"]
        # M = 300 rows, N = 384 + 64 + 96 = 544: 3 x 17 tiles of 128 x 32 (no wider
        # tile fills the SMs), boxes of 32 weight rows
        assert cuda_tiles.tma_tile_for(300, 544, 256).bn == 32
        projs = (attn.q_proj, attn.k_proj, attn.v_proj)
        for proj, arr, n in zip(projs, group["arrays"][-3:], (384, 64, 96)):
            assert arr.dtype == mx.uint8 and arr.shape == (cuda_tma.WEIGHT_MAPS_BYTES,)
            assert read_prototypes(arr) == maps_of(n)
            assert arr is cuda_tma.weight_maps(proj.quantized_weight, 32)
        blocks = group["grid"][0] // group["threadgroup"][0]
        assert blocks == 3 * (12 + 2 + 3) and group["threadgroup"][0] == 256 + 32
        # The members take every output the memo holds: nothing left pending, so later
        # forwards never count the launch as unused (a pending scratch output once
        # switched every TMA group off after 8 forwards).
        sib = attn.q_proj.siblings
        assert getattr(sib._memo, "last", None) is None
        attn.q_proj(x)
        assert len(sib._memo.last[1]) == 3  # the launch's outputs, as members see them
        attn.k_proj(x), attn.v_proj(x)
        for _ in range(2 * siblings.MAX_UNUSED):
            x = mx.zeros((3, 100, 256), dtype=mx.bfloat16)
            attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        assert sib.enabled and sib.unused == 0
        assert attn.v_proj.decision(300, mx.bfloat16)[1] == "test+siblings"
    finally:
        registry.set_chooser(previous)
    layer = attn.k_proj
    layer.kernel = "cuda_w8a8_gemm_tma"  # alone: N = 64 takes the 128 x 32 tile (6 tiles)
    start = len(rec.launches)
    layer(mx.zeros((3, 100, 256), dtype=mx.bfloat16))  # a new x: quantized anew
    plan = rec.launches[-1]
    assert plan["name"] == "w8a8_gemm_ws_tma_channel_u8" and len(rec.launches) - start == 2
    assert plan["inputs"][-1] == "wmap" and plan["outputs"] == ["y"]
    assert read_prototypes(plan["arrays"][-1]) == maps_of(64)
    assert plan["arrays"][-1] is group["arrays"][-2]  # the weight's one array, k_proj's
    for lead in ((2, 5), (128,)):  # below one row tile, exactly one: the same array
        layer(mx.zeros((*lead, 256), dtype=mx.bfloat16))
        assert rec.launches[-1]["arrays"][-1] is plan["arrays"][-1]


def test_tma_candidates_need_the_driver(monkeypatch):
    """Without a driver that encodes tensor maps the TMA candidates are not offered (the
    cp.async ones still are); on a GPU other than Hopper neither is."""
    from mlx_w8a8.kernels.registry import Problem

    p = Problem("linear", 512, 4096, 4096, "bfloat16", "per_channel", 64, False)
    i8 = Problem("int8_matmul", 512, 4096, 4096, "int8", "int8")
    gemm_tma = registry.get("linear", "cuda_w8a8_gemm_tma").supports
    int8_tma = registry.get("int8_matmul", "cuda_int8_gemm_tma").supports
    monkeypatch.setattr(launch, "is_sm90", lambda: True)
    assert gemm_tma(p) and int8_tma(i8)
    monkeypatch.setattr(tensormap, "available", lambda: False)
    assert not gemm_tma(p) and not int8_tma(i8)
    assert registry.get("linear", "cuda_w8a8_gemm_ws").supports(p)
    monkeypatch.setattr(tensormap, "available", lambda: True)
    monkeypatch.setattr(launch, "is_sm90", lambda: False)
    assert not gemm_tma(p) and not int8_tma(i8)


# The group-wise TMA GEMM (gemm_grouped_ws.cu) ----------------------------------------------
H200_SHARED_MEMORY = 227 * 1024  # the most dynamic shared memory a block can opt into


def test_grouped_tma_tiles_fit_shared_memory_and_registers():
    """Every group-wise TMA tile at every group size fits an H200's 227 KiB of shared
    memory, and the kernel's layout (1024-byte aligned ring of A/B tiles, the terms' ring,
    8 x 2560 bytes of epilogue staging, 2 mbarriers per stage, up to four 128-byte maps
    after them aligned to 128) lies inside what the launch asks for; a stage's A/B part keeps
    the 1024-byte swizzle atoms aligned and its terms slab the bulk copy's 16 bytes. The
    128-wide tile has the producer warpgroup (its consumers need 3 x 64 accumulator
    registers: setmaxnreg gives them 232), the narrower ones one producer warp. (Maps:
    A's and one per member of a sibling launch.)"""
    for cfg in cuda_tiles.GROUPED_TMA_CONFIGS.values():
        assert cfg.threads == 256 + 32 * cfg.producers
        assert (cfg.producers == 4) == (cfg.bn == 128), cfg
        for gs in cuda_tiles.GROUPED_TMA_GROUP_SIZES:
            stage = (cfg.bm + cfg.bn) * 128
            terms = (128 // gs) * cfg.bn * 8
            assert stage % 1024 == 0 and terms % 16 == 0
            # the kernel's own layout, from the worst base alignment (1023 bytes lost)
            bars_end = 1023 + cfg.stages * (stage + terms) + 8 * 2560 + 16 * cfg.stages
            used = bars_end + 127 + (1 + launch.MAX_SIBLINGS) * tensormap.MAP_BYTES
            assert used <= cfg.shared_memory(gs) <= H200_SHARED_MEMORY, (cfg, gs, used)
        # one stage more would not fit at group size 32 (the ring is as deep as it can be)
        deeper = cfg._replace(stages=cfg.stages + 1)
        assert deeper.shared_memory(32) > H200_SHARED_MEMORY, cfg


@pytest.mark.parametrize("m,n,k,gs,dtype,has_bias", [
    (1, 96, 256, 64, "bfloat16", False),        # decode: one 128-row tile, A's box 1 row
    (77, 1000, 512, 32, "float16", True),       # odd M, N not a multiple of any tile
    (300, 4096, 1024, 128, "float32", False),   # 3 x 128 tiles of 128 x 32
    (2048, 4096, 4096, 64, "bfloat16", True),   # prefill: 128 x 128 tiles, 16 x 32 of them
])
def test_grouped_tma_launch_plan(cuda_here, rng, m, n, k, gs, dtype, has_bias):
    """The candidate's launches, recorded: the quantize's ``sums`` body (the existing
    kernel, template T and GS) writing codes [M, K], scales [M, 1] and the group sums in
    a grouped_sums_shape array (256 bytes of map area after the M x G sums), then the
    group-wise GEMM reading exactly those three arrays, the weight's codes, its terms
    (grouped_terms: the tile's [G, BN, 2] pairs per tile column), the float32 bias and
    the weight's map array (A's prototype [128, K], then B's [N, K] in BN-row boxes);
    the grid is min(tiles, 132) blocks of 256 + 32 PW threads; the shared memory is the
    tile's at this group size; the template and the variant key name the tile; the
    bound form makes the same launches."""
    import mlx.core as mx

    from mlx_w8a8.kernels import registry
    from mlx_w8a8.kernels.registry import Problem
    from mlx_w8a8.weight import QuantizedWeight

    rec = cuda_here
    cand = registry.get("linear", "cuda_w8a8_gemm_grouped_tma")
    p = Problem("linear", m, n, k, dtype, "grouped", gs, has_bias)
    assert cand.supports(p)
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32))
    qw = QuantizedWeight.from_float(w, gs, per_channel=False)
    bias = mx.array(rng.standard_normal(n).astype(np.float32)).astype(mx.bfloat16) if has_bias else None
    x = mx.zeros((m, k), dtype=getattr(mx, dtype))
    cfg = cuda_tiles.grouped_tma_tile_for(m, n)
    groups = k // gs
    start = len(rec.launches)
    y = cand.run(x, qw, bias)
    quant, gemm = rec.launches[start:]
    assert y.shape == (m, n) and y.dtype == x.dtype
    assert quant["name"] == "w8a8_quantize_sums"
    assert quant["template"] == [("T", x.dtype), ("GS", gs)]
    assert quant["output_shapes"] == [(m, k), (m, 1), (m * groups + 64,)]
    assert quant["output_dtypes"] == [mx.int8, mx.float32, mx.int32]
    # M = 17-112 leaves consumer warps without rows: the tile skips them (GroupedTmaConfig.live),
    # which only the tma_groupwise body does; else the shipped table's tma_grouped body.
    assert cfg.live == (17 <= m <= 112)
    body = "tma_groupwise" if cfg.live else "tma_grouped"
    assert gemm["name"] == "w8a8_gemm_grouped_ws_" + body + ("_bias" if has_bias else "")
    names = ["xq", "xs", "xr", "w", "wt"] + (["bias"] if has_bias else []) + ["wmap"]
    assert gemm["inputs"] == names and gemm["outputs"] == ["y"]
    arrays = dict(zip(names, gemm["arrays"]))
    tiles_n = -(-n // cfg.bn)
    want = {"xq": ((m, k), mx.int8), "xs": ((m, 1), mx.float32),
            "xr": ((m * groups + 64,), mx.int32), "w": ((n, k // 4), mx.uint32),
            "wt": ((tiles_n * groups * cfg.bn * 2,), mx.float32),
            "bias": ((n,), mx.float32), "wmap": ((cuda_tma.WEIGHT_MAPS_BYTES,), mx.uint8)}
    for name, a in arrays.items():
        assert (a.shape, a.dtype) == want[name], (name, a.shape, a.dtype)
    assert arrays["w"] is qw.q
    assert arrays["wt"] is cuda_gemm_grouped.grouped_terms(qw, cfg.bn)
    assert arrays["wmap"] is cuda_tma.weight_maps(qw, cfg.bn)
    assert read_prototypes(arrays["wmap"]) == [(128, k, 128), (n, k, cfg.bn), (0, 0, 0), (0, 0, 0)]
    if has_bias:
        assert np.array_equal(np.array(arrays["bias"]), np.array(bias.astype(mx.float32)))
    tiles = -(-m // 128) * tiles_n
    assert gemm["threadgroup"] == (cfg.threads, 1, 1)
    assert gemm["grid"] == (min(tiles, launch.SMS) * cfg.threads, 1, 1)
    assert gemm["shared_memory"] == cfg.shared_memory(gs) <= H200_SHARED_MEMORY
    skip = [("WB", 8), ("AG", False), ("ORD", False), ("LIVE", True), ("PIPE", 0)] if cfg.live else []
    assert gemm["template"] == [("T", x.dtype), ("GS", gs), ("BN", cfg.bn),
                                ("STAGES", cfg.stages), ("PW", cfg.producers)] + skip
    assert gemm["output_shapes"] == [(m, n)] and gemm["output_dtypes"] == [x.dtype]
    assert cand.variant(p) == (dtype, has_bias, gs, cfg)
    # The bound form: the quantize's outputs are the GEMM's activations, as they are.
    key, quantize, apply = cand.bind_stages(p, qw, bias)
    assert key == ("cuda_per_token", "sums_map", gs) == cand.stages(p)[0]
    acts = quantize(x)
    start = len(rec.launches)
    apply(acts)
    (bound,) = rec.launches[start:]
    assert all(a is b for a, b in zip(bound["arrays"][:3], acts))
    assert not _same_launches([bound], [gemm])


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("option,name,value", [("live", "LIVE", True), ("pipe", "PIPE", 2),
                                               ("pipe", "PIPE", 4)])
def test_grouped_tma_tile_options_take_the_groupwise_body(cuda_here, rng, bits, option, name,
                                                          value):
    """A tile with the rows-past-M skip (GroupedTmaConfig.live) or the pipelined
    promotion (``pipe``) launches the ``tma_groupwise`` body with that template argument
    set, else as the plain tile (same arrays, grid, threads, shared memory); the plain
    8-bit tile keeps the shipped ``tma_grouped`` body and template (what the table
    measured), and every ``tma_groupwise`` launch ends ``("LIVE", False), ("PIPE", 0)``
    when both are off."""
    import mlx.core as mx

    from mlx_w8a8.weight import QuantizedWeight

    rec = cuda_here
    m, n, k, gs = 40, 1000, 512, 64
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32))
    if bits == 4:
        wq, sq, bq = mx.quantize(w, group_size=gs, bits=4)
        qw = QuantizedWeight(wq, sq, bq, gs, per_channel=False, bits=4)
    else:
        qw = QuantizedWeight.from_float(w, gs, per_channel=False)
    x = mx.zeros((m, k), dtype=mx.bfloat16)
    cfg = cuda_tiles.grouped_tma_tile_for(m, n, bits)._replace(live=False)
    assert value in cuda_tiles.PIPE_RUNS[cfg.bn] or option == "live"
    launches = {}
    for on in (False, True):
        xq, xs, xr = cuda_quantize.quantize_groups(x, gs)
        start = len(rec.launches)
        tile = cfg._replace(**{option: value}) if on else cfg
        cuda_gemm_grouped.gemm_grouped_tma(xq, xs, xr, qw, None, mx.bfloat16, tile)
        (launches[on],) = rec.launches[start:]
    plain, opt = launches[False], launches[True]
    assert opt["name"] == "w8a8_gemm_grouped_ws_tma_groupwise"
    want = {"LIVE": False, "PIPE": 0, name: value}
    assert opt["template"][-2:] == [("LIVE", want["LIVE"]), ("PIPE", want["PIPE"])]
    if bits == 8:
        assert plain["name"] == "w8a8_gemm_grouped_ws_tma_grouped"
        assert plain["template"] == [("T", mx.bfloat16), ("GS", gs)] + cfg.template()
        assert opt["template"][:-2] == plain["template"] + [("WB", 8), ("AG", False), ("ORD", False)]
    else:
        assert plain["template"][-2:] == [("LIVE", False), ("PIPE", 0)]
        assert opt["template"][:-2] == plain["template"][:-2]
    for field in ("grid", "threadgroup", "shared_memory", "inputs", "outputs", "output_shapes"):
        assert opt[field] == plain[field], field


@pytest.mark.parametrize("bn,k,gs,want", [
    (128, 4096, 64, 2),  # 64 groups; runs of 4 spill at bn = 128
    (64, 4096, 64, 4), (32, 14336, 128, 4),  # 112 groups
    (64, 384, 128, 0),  # 3 groups: no run divides them
    (32, 768, 128, 2),  # 6 groups: 4 does not divide them
])
def test_pipe_run_takes_the_longest_run_dividing_the_groups(bn, k, gs, want):
    """pipe_run: the longest of the tile's PIPE_RUNS that divides K / group_size (the
    kernel runs a tile's groups in whole runs), 0 where none does."""
    cfg = next(c for c in cuda_tiles.GROUPED_TMA_CONFIGS.values() if c.bn == bn)
    assert cuda_tiles.pipe_run(cfg, k, gs) == want


@pytest.mark.parametrize("m,n,k,gs,dtype,has_bias", [
    (77, 1000, 512, 32, "float16", True),       # odd M, N not a multiple of any tile
    (2048, 4096, 4096, 64, "bfloat16", False),  # prefill: 128 x 128 tiles
])
def test_w4a8_tma_launch_plan(cuda_here, rng, m, n, k, gs, dtype, has_bias):
    """The 4-bit candidate's launches, recorded: the same quantize launch as the 8-bit
    group-wise TMA GEMM (one activation format: its act key is theirs), then the
    ``tma_groupwise`` body (``WB`` 4, ``AG`` false) reading the packed words as stored (``[N, K / 8]`` uint32, the
    weight's own array: no second copy), terms ``(s, b)`` (the stored bias, no 128
    offset), and a map array whose second prototype reads the packed codes: ``[N, K / 2]``
    bytes in BN-row boxes of 64 bytes, unswizzled; a 4-bit tile (four producer warps,
    its shared memory) chosen by the output's size."""
    import mlx.core as mx

    from mlx_w8a8.kernels import registry
    from mlx_w8a8.kernels.registry import Problem
    from mlx_w8a8.weight import QuantizedWeight

    rec = cuda_here
    cand = registry.get("linear", "cuda_w4a8_gemm_tma")
    p = Problem("linear", m, n, k, dtype, "grouped4", gs, has_bias)
    assert cand.supports(p)
    assert not cand.supports(Problem("linear", m, n, k, dtype, "grouped", gs, has_bias))
    assert not registry.get("linear", "cuda_w8a8_gemm_grouped_tma").supports(p)
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32))
    qw = QuantizedWeight.from_float(w, gs, per_channel=False, bits=4)
    bias = mx.array(rng.standard_normal(n).astype(np.float32)).astype(mx.bfloat16) if has_bias else None
    x = mx.zeros((m, k), dtype=getattr(mx, dtype))
    cfg = cuda_tiles.grouped_tma_tile_for(m, n, 4)
    assert cfg.bits == 4 and cfg.producers == 4
    assert cfg._replace(live=False) in cuda_tiles.GROUPED4_TMA_CONFIGS.values()
    assert cfg.live == (17 <= m <= 112)  # the rows-past-M skip where warps have no row
    groups = k // gs
    start = len(rec.launches)
    y = cand.run(x, qw, bias)
    quant, gemm = rec.launches[start:]
    assert y.shape == (m, n) and y.dtype == x.dtype
    assert quant["name"] == "w8a8_quantize_sums"
    assert quant["output_shapes"] == [(m, k), (m, 1), (m * groups + 64,)]
    assert gemm["name"] == "w8a8_gemm_grouped_ws_tma_groupwise" + ("_bias" if has_bias else "")
    names = ["xq", "xs", "xr", "w", "wt"] + (["bias"] if has_bias else []) + ["wmap"]
    arrays = dict(zip(names, gemm["arrays"]))
    assert gemm["inputs"] == names
    assert arrays["w"] is qw.q and arrays["w"].shape == (n, k // 8)
    terms = np.array(arrays["wt"]).reshape(-1, groups, cfg.bn, 2)
    s_, b_ = (np.array(a.astype(mx.float32)) for a in (qw.scales, qw.biases))
    assert np.array_equal(terms[0, :, 0, 0], s_[0]) and np.array_equal(terms[0, :, 0, 1], b_[0])
    assert read_prototypes(arrays["wmap"])[:2] == [(128, k, 128), (n, k // 2, cfg.bn)]
    raw = np.array(arrays["wmap"]).tobytes()
    assert np.frombuffer(raw[128 + 24:128 + 40], dtype=np.uint64).tolist() == [64, 0]
    assert gemm["threadgroup"] == (384, 1, 1)
    assert gemm["shared_memory"] == cfg.shared_memory(gs) <= H200_SHARED_MEMORY
    assert gemm["template"] == [("T", x.dtype), ("GS", gs), ("BN", cfg.bn),
                                ("STAGES", cfg.stages), ("PW", 4), ("WB", 4), ("AG", False), ("ORD", False),
                                ("LIVE", cfg.live), ("PIPE", 0)]
    key, _, _ = cand.bind_stages(p, qw, bias)
    assert key == registry.get("linear", "cuda_w8a8_gemm_grouped_tma").stages(
        Problem("linear", m, n, k, dtype, "grouped", gs, has_bias))[0]


@pytest.mark.parametrize("fmt,m,n,k,gs,dtype,has_bias", [
    ("grouped", 300, 1000, 512, 64, "bfloat16", True),    # odd N, 8-bit codes, bias
    ("grouped4", 2048, 4096, 1024, 32, "float16", False),  # prefill tile, 4-bit codes
])
def test_act_groups_tma_launch_plan(cuda_here, rng, fmt, m, n, k, gs, dtype, has_bias):
    """The activation-group candidate: offered for act_scales="group" problems only, on
    both group-wise formats; its quantize is the ``groups`` body (codes [M, K], one float32
    scale per row and group [M, K / GS], the group sums in a grouped_sums_shape array) and
    its GEMM the ``tma_groupwise`` body with ``AG`` true and the weight's code width,
    reading exactly those three arrays; the bound form makes the same launches."""
    import mlx.core as mx

    from mlx_w8a8.kernels import registry
    from mlx_w8a8.kernels.registry import Problem
    from mlx_w8a8.weight import QuantizedWeight

    rec = cuda_here
    cand = registry.get("linear", "cuda_act_groups_gemm_tma")
    assert cand.act_scales == ("group",)
    p = Problem("linear", m, n, k, dtype, fmt, gs, has_bias, act_scales="group")
    assert cand.handles(p)
    assert not cand.handles(Problem("linear", m, n, k, dtype, fmt, gs, has_bias))
    for other in ("cuda_w8a8_gemm_grouped_tma", "cuda_w4a8_gemm_tma"):
        assert not registry.get("linear", other).handles(p)
    bits = 4 if fmt == "grouped4" else 8
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32))
    qw = QuantizedWeight.from_float(w, gs, per_channel=False, bits=bits)
    bias = mx.array(rng.standard_normal(n).astype(np.float32)).astype(mx.bfloat16) if has_bias else None
    x = mx.zeros((m, k), dtype=getattr(mx, dtype))
    cfg = cuda_tiles.grouped_tma_tile_for(m, n, bits)
    groups = k // gs
    key, quantize, apply = cand.bind_stages(p, qw, bias)
    assert key == ("cuda_act_groups", gs)
    start = len(rec.launches)
    acts = quantize(x)
    y = apply(acts)
    quant, gemm = rec.launches[start:]
    assert y.shape == (m, n) and y.dtype == x.dtype
    assert quant["name"] == "w8a8_quantize_groups"
    assert quant["template"] == [("T", x.dtype), ("GS", gs)]
    assert quant["output_shapes"] == [(m, k), (m, groups), (m * groups + 64,)]
    assert quant["output_dtypes"] == [mx.int8, mx.float32, mx.int32]
    assert quant["threadgroup"][0] % 32 == 0 and quant["grid"][0] == m * quant["threadgroup"][0]
    assert gemm["name"] == "w8a8_gemm_grouped_ws_tma_groupwise" + ("_bias" if has_bias else "")
    assert all(a is b for a, b in zip(gemm["arrays"][:3], acts))
    assert gemm["template"] == [("T", x.dtype), ("GS", gs), ("BN", cfg.bn), ("STAGES", cfg.stages),
                                ("PW", cfg.producers), ("WB", bits), ("AG", True), ("ORD", False),
                                ("LIVE", cfg.live), ("PIPE", 0)]
    assert gemm["shared_memory"] == cfg.shared_memory(gs) <= H200_SHARED_MEMORY
    start = len(rec.launches)
    cand.run(x, qw, bias)
    assert not _same_launches(rec.launches[start:], [quant, gemm])


def test_act_groups_quantize_refuses_what_it_cannot_take():
    """The activation-group quantize names the op, the value and what is valid: a group
    size outside 32/64/128 or not dividing K; a 4-bit tile for an 8-bit weight (and the
    reverse) is refused by the group-wise GEMM's launch spec."""
    import mlx.core as mx

    from mlx_w8a8.weight import QuantizedWeight

    for gs, k in ((16, 256), (64, 96), (128, 192)):
        with pytest.raises(ValueError, match=r"\[mlx_w8a8.cuda_quantize\] group_size must be one of"):
            cuda_quantize.quantize_act_groups_spec(4, k, mx.bfloat16, gs)
    w = mx.random.normal((64, 256), key=mx.random.key(0))
    for bits, wrong in ((8, cuda_tiles.GROUPED4_TMA_CONFIGS["g4tma64"]),
                        (4, cuda_tiles.GROUPED_TMA_CONFIGS["gtma64"])):
        qw = QuantizedWeight.from_float(w, 64, per_channel=False, bits=bits)
        with pytest.raises(ValueError, match=rf"{bits}-bit codes"):
            cuda_gemm_grouped.gemm_grouped_tma_spec(8, 256, qw, None, mx.bfloat16, wrong,
                                                    act_groups=True)


def test_w4a8_tma_tiles_fit_shared_memory():
    """Each 4-bit tile: four producer warps, the ring with its packed rows and third
    mbarrier within the kernel's layout and an H200's shared memory at every group size,
    and as deep as fits at group size 32."""
    for cfg in cuda_tiles.GROUPED4_TMA_CONFIGS.values():
        assert cfg.threads == 384 and cfg.bits == 4
        for gs in cuda_tiles.GROUPED_TMA_GROUP_SIZES:
            stage = (cfg.bm + cfg.bn) * 128
            terms, packed = (128 // gs) * cfg.bn * 8, cfg.bn * 64
            assert packed % 1024 == 0 or cfg.bn == 32
            bars_end = 1023 + cfg.stages * (stage + terms + packed) + 8 * 2560 + 24 * cfg.stages
            used = bars_end + 127 + (1 + launch.MAX_SIBLINGS) * tensormap.MAP_BYTES
            assert used <= cfg.shared_memory(gs) <= H200_SHARED_MEMORY, (cfg, gs, used)
        assert cfg._replace(stages=cfg.stages + 1).shared_memory(32) > H200_SHARED_MEMORY, cfg


def test_grouped_tma_tile_follows_the_output():
    """The tile is the widest whose output fills the SMs (tiles_filling): 128 x 128 on a
    prefill of Llama-3-8B's projections, narrower where M x N has few tiles."""
    pick = cuda_tiles.grouped_tma_tile_for
    assert pick(2048, 4096).bn == 128 and pick(2048, 14336).bn == 128
    assert pick(128, 4096).bn == 32  # 128 tiles of 128 x 32; 64 of 128 x 64
    assert pick(256, 4096).bn == 64  # 128 tiles of 128 x 64
    assert pick(1, 96).bn == 32


@pytest.mark.parametrize("bits", [8, 4])
def test_grouped_tma_tile_skips_idle_warps_only_in_one_row_tile(bits):
    """The rows-past-M skip (GroupedTmaConfig.live) is on exactly at M = 17-112: there the
    one 128-row tile leaves a consumer warp (16 rows each) without a row (measured faster
    at M = 16 and 64 on an H200, tiles.grouped_tma_tile_for); at M = 113-128 every warp
    has a row, past 128 the plain tile stays (unmeasured there), and at M <= 16 it stays
    for the shipped table's M = 16 bucket, which timed the plain tile. The skip changes
    nothing else of the tile."""
    pick = cuda_tiles.grouped_tma_tile_for
    configs = cuda_tiles.GROUPED4_TMA_CONFIGS if bits == 4 else cuda_tiles.GROUPED_TMA_CONFIGS
    for m, live in [(1, False), (2, False), (16, False), (17, True), (32, True), (64, True),
                    (65, True), (112, True), (113, False), (128, False), (129, False),
                    (200, False), (2048, False)]:
        for n in (96, 4096, 14336):
            cfg = pick(m, n, bits)
            assert cfg.live == live, (m, n, bits, cfg)
            assert cfg._replace(live=False) in configs.values() and cfg.bits == bits
            assert cuda_tiles.tiles_filling(m, n, configs.values()) == cfg._replace(live=False)


@pytest.mark.parametrize("bits", [8, 4])
def test_grouped_tma_tile_pipelines_only_at_pipe_m(bits, monkeypatch):
    """The pipelined promotion (GroupedTmaConfig.pipe) is on exactly at PIPE_M, with the
    tile's longest run at K and the group size (pipe_run: 0 where none divides K /
    group_size), and only when the caller gives both; nothing else of the tile changes.
    PIPE_M is patched: the shipped policy's range is a measured choice, checked in
    test_pipe_m_is_the_shipped_policy."""
    pick = cuda_tiles.grouped_tma_tile_for
    monkeypatch.setattr(cuda_tiles, "PIPE_M", range(100, 3000))
    for m in (16, 99, 100, 128, 2048, 2999, 3000):
        for n, k, gs in [(4096, 4096, 64), (14336, 4096, 128), (4096, 14336, 32),
                         (96, 384, 128)]:  # 3 groups: no run divides them
            plain = pick(m, n, bits)
            cfg = pick(m, n, bits, k, gs)
            want = cuda_tiles.pipe_run(plain, k, gs) if 100 <= m < 3000 else 0
            assert cfg == plain._replace(pipe=want), (m, n, k, gs, cfg)
            assert plain.pipe == 0 and pick(m, n, bits, k) == plain
    assert pick(2048, 4096, bits, 4096, 64).pipe == 2  # bn 128: runs of 2 only
    assert pick(2048, 4096, bits, 384, 128).pipe == 0


def test_grouped_tma_launches_take_the_pipe_policy(cuda_here, monkeypatch, rng):
    """Every default launch of the group-wise TMA GEMM passes K and the group size to
    grouped_tma_tile_for: with PIPE_M patched to cover M, the candidates' tiles, the
    single-weight spec and the sibling spec (on the summed N) all launch PIPE =
    pipe_run of their tile (runs of 4 at these 128 x 32 tiles, 8 groups), and with it
    empty PIPE = 0."""
    import mlx.core as mx

    from mlx_w8a8.kernels.registry import Problem
    from mlx_w8a8.weight import QuantizedWeight

    m, n, k, gs = 128, 256, 512, 64
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32))
    weights = [QuantizedWeight.from_float(w, gs, per_channel=False, bits=b) for b in (8, 4)]

    def run(bits, total_n):  # what the policy gives when it is on
        return cuda_tiles.pipe_run(cuda_tiles.grouped_tma_tile_for(m, total_n, bits), k, gs)

    assert run(8, n) == 4 and run(4, n) == 4 and run(8, 2 * n) == 4
    for on in (False, True):
        monkeypatch.setattr(cuda_tiles, "PIPE_M", range(1, 4096) if on else range(0))
        for kind, fmt, bits in [(cuda_gemm_grouped.W8A8GemmGroupedTma, "grouped", 8),
                                (cuda_gemm_grouped.W4A8GemmTma, "grouped4", 4),
                                (cuda_gemm_grouped.ActGroupsTma, "grouped4", 4)]:
            p = Problem("linear", m, n, k, "bfloat16", fmt, gs, False)
            assert kind().tile(p).pipe == (run(bits, n) if on else 0), (kind, on)
        for qw in weights:
            single = cuda_gemm_grouped.gemm_grouped_tma_spec(m, k, qw, None, mx.bfloat16)
            group = cuda_gemm_grouped.gemm_grouped_tma_group_spec(m, k, [(qw, None), (qw, None)],
                                                                  mx.bfloat16)
            for spec, total_n in ((single, n), (group, 2 * n)):
                want = run(qw.bits, total_n) if on else 0
                # (the plain 8-bit body, tma_grouped, has no PIPE argument: 0)
                assert dict(spec.template).get("PIPE", 0) == want, (qw.bits, on, spec.template)


def test_pipe_m_is_the_shipped_policy():
    """The shipped policy: PIPE_M is empty (the pipelined promotion gained at most 3% on
    all but one measured shape, docs/cuda.md; the shipped H200 table's group-wise entries
    timed the plain tile, so turning it on stales them)."""
    assert list(cuda_tiles.PIPE_M) == []
    assert all(cuda_tiles.grouped_tma_tile_for(m, n, bits, 4096, 64).pipe == 0
               for m in (1, 64, 128, 512, 2048, 8192) for n in (4096, 14336) for bits in (8, 4))


def test_grouped_terms_are_where_the_kernel_reads_them(rng):
    """A model of the kernel's index math on grouped_terms' array: the producer's bulk
    copy for tile column tn and k-tile kt starts at float ((tn G + kt kGroups) BN 2),
    16-byte aligned, and holds kGroups BN pairs; the consumer reads group j's pair for
    tile column c at 2 (j BN + c) floats into it (c = 8 i + 2 (lane % 4) + {0, 1}); that
    pair must be the float32 scale and offset (b + 128 s) of weight row tn BN + c and
    group kt kGroups + j, and zeros past N (the last tile column's rows past N feed
    columns never stored, and must not be read out of bounds). Scales stored in float16,
    bfloat16 and float32; N = 200 (not a multiple of any tile)."""
    import mlx.core as mx

    from mlx_w8a8.weight import QuantizedWeight

    n, k = 200, 512
    for (gs, sdtype), bn in zip(((32, mx.float16), (64, mx.bfloat16), (128, mx.float32)),
                                (32, 64, 128)):
        w = mx.array(rng.standard_normal((n, k)).astype(np.float32)).astype(sdtype)
        qw = QuantizedWeight.from_float(w, gs, per_channel=False)
        assert qw.scales.dtype == sdtype
        terms = np.array(cuda_gemm_grouped.grouped_terms(qw, bn))
        s = np.array(qw.scales.astype(mx.float32))
        o = np.array(qw.biases.astype(mx.float32)) + 128.0 * s  # float32, as group_offsets
        groups, per_tile = k // gs, 128 // gs
        tiles_n = -(-n // bn)
        assert terms.dtype == np.float32 and terms.shape == (tiles_n * groups * bn * 2,)
        for tn in range(tiles_n):
            for kt in range(k // 128):
                base = (tn * groups + kt * per_tile) * bn * 2
                assert (4 * base) % 16 == 0 and (per_tile * bn * 8) % 16 == 0
                slab = terms[base: base + per_tile * bn * 2]
                for j in range(per_tile):
                    for c in range(bn):
                        row, g = tn * bn + c, kt * per_tile + j
                        pair = slab[2 * (j * bn + c): 2 * (j * bn + c) + 2]
                        want = (s[row, g], o[row, g]) if row < n else (0.0, 0.0)
                        assert tuple(pair) == want, (gs, bn, tn, kt, j, c)
        assert cuda_gemm_grouped.grouped_terms(qw, bn) is cuda_gemm_grouped.grouped_terms(qw, bn)  # kept


def test_grouped_tma_siblings_launch_once(cuda_here):
    """q/k/v Linears of a grouped (mlx-lm 8-bit style) checkpoint linked as siblings on
    the group-wise TMA candidate: the first member called makes the quantize launch and
    one tma_grouped_group3 launch taking xq, xs, xr, each member's codes, terms and bias,
    then each member's map array (A's prototype [128, K], the member's [N_g, K] in
    BN-row boxes); the grid covers the members' tiles one after another; the outputs are
    the members' shapes; the other members launch nothing. A sibling launch refuses
    members of another group size, a bias on some members only, or one member."""
    import mlx.core as mx
    import mlx.nn as nn

    import mlx_w8a8 as w8
    from mlx_w8a8 import siblings
    from mlx_w8a8.kernels import registry

    rec = cuda_here

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(256, n, bias=True)
                                                     for n in (384, 64, 96))

    attn = Attention()
    w8.quantize(attn, per_channel=False, group_size=64)
    assert attn.q_proj.quantized_weight.format == "grouped"
    cand = registry.get("linear", "cuda_w8a8_gemm_grouped_tma")
    previous = registry.set_chooser(lambda problem, found: (cand, "test") if cand in found else None)
    try:
        siblings.clear()
        x = mx.zeros((3, 100, 256), dtype=mx.bfloat16)
        start = len(rec.launches)
        outs = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)]
        assert [y.shape for y in outs] == [(3, 100, 384), (3, 100, 64), (3, 100, 96)]
        plans = rec.launches[start:]
        assert [p["name"] for p in plans] == ["w8a8_quantize_sums",
                                              "w8a8_gemm_grouped_ws_tma_grouped_group3_bias"]
        assert plans[0]["output_shapes"][2] == cuda_quantize.grouped_sums_shape(300, 256, 64)
        group = plans[1]
        names = ["xq", "xs", "xr"] + [f"{a}{g}" for g in range(3) for a in ("w", "wt", "bias")]
        assert group["inputs"] == names + ["wmap0", "wmap1", "wmap2"]
        assert group["outputs"] == ["y0", "y1", "y2"]
        assert group["output_shapes"] == [(3, 100, 384), (3, 100, 64), (3, 100, 96)]
        cfg = cuda_tiles.grouped_tma_tile_for(300, 544)
        assert cfg.bn == 32  # 3 x 17 tiles of 128 x 32: no wider tile fills the SMs
        assert group["template"][:2] == [("T", mx.bfloat16), ("GS", 64)]
        blocks = group["grid"][0] // group["threadgroup"][0]
        assert blocks == 3 * (12 + 2 + 3) and group["threadgroup"][0] == cfg.threads
        assert group["shared_memory"] == cfg.shared_memory(64)
        arrays = dict(zip(group["inputs"], group["arrays"]))
        for g, (proj, n) in enumerate(zip((attn.q_proj, attn.k_proj, attn.v_proj), (384, 64, 96))):
            qw = proj.quantized_weight
            assert arrays[f"w{g}"] is qw.q
            assert arrays[f"wt{g}"] is cuda_gemm_grouped.grouped_terms(qw, 32)
            assert arrays[f"wt{g}"].shape == (-(-n // 32) * 4 * 32 * 2,)
            assert arrays[f"bias{g}"].dtype == mx.float32 and arrays[f"bias{g}"].shape == (n,)
            assert arrays[f"wmap{g}"] is cuda_tma.weight_maps(qw, 32)
            assert read_prototypes(arrays[f"wmap{g}"]) == [(128, 256, 128), (n, 256, 32),
                                                           (0, 0, 0), (0, 0, 0)]
        assert attn.v_proj.decision(300, mx.bfloat16)[1] == "test+siblings"
    finally:
        registry.set_chooser(previous)
    op = r"\[mlx_w8a8.cuda_w8a8_gemm_grouped_tma\]"
    qw = attn.q_proj.quantized_weight
    other = w8.quantize_weight(mx.zeros((64, 256)), group_size=32, per_channel=False)
    with pytest.raises(ValueError, match=op + " sibling weights must be grouped"):
        cuda_gemm_grouped.gemm_grouped_tma_group_spec(8, 256, [(qw, None), (other, None)], mx.bfloat16)
    with pytest.raises(ValueError, match=op + " sibling weights must all have a bias or none"):
        cuda_gemm_grouped.gemm_grouped_tma_group_spec(8, 256, [(qw, None), (qw, mx.zeros((384,)))],
                                           mx.bfloat16)
    with pytest.raises(ValueError, match=op + " a sibling launch takes 2 to 3 weights"):
        cuda_gemm_grouped.gemm_grouped_tma_group_spec(8, 256, [(qw, None)], mx.bfloat16)


def test_grouped_tma_refuses_what_it_cannot_take(cuda_here, rng):
    """supports() declines a per-channel weight, K not a multiple of 128 (a k-tile would
    hold part of a group), no Hopper GPU, no tensor maps; the launcher raises a
    ValueError naming the op for those, and for group sums without the map area (the
    [M, G] array of quantize(): the kernel would write A's map past its end)."""
    import mlx.core as mx

    from mlx_w8a8.kernels.registry import Problem
    from mlx_w8a8.weight import QuantizedWeight

    import attrs

    ok = Problem("linear", 64, 256, 512, "bfloat16", "grouped", 64, False)
    supports = registry.get("linear", "cuda_w8a8_gemm_grouped_tma").supports
    assert supports(ok)
    assert not supports(attrs.evolve(ok, weight_format="per_channel"))
    assert not supports(attrs.evolve(ok, k=576))  # 9 groups of 64: 4.5 k-tiles
    assert supports(attrs.evolve(ok, k=640, group_size=128))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tensormap, "available", lambda: False)
        assert not supports(ok)
        mp.setattr(tensormap, "available", lambda: True)
        mp.setattr(launch, "is_sm90", lambda: False)
        assert not supports(ok)
    op = r"\[mlx_w8a8.cuda_w8a8_gemm_grouped_tma\]"
    w = mx.array(rng.standard_normal((64, 576)).astype(np.float32))
    x = mx.zeros((4, 576), dtype=mx.bfloat16)
    with pytest.raises(ValueError, match=op + " K must be .* a multiple of 128"):
        cuda_gemm_grouped.gemm_grouped_tma_spec(4, 576, QuantizedWeight.from_float(w, 64, per_channel=False),
                                     None, mx.bfloat16)
    per_channel = QuantizedWeight.from_float(w[:, :512], 64, per_channel=True)
    with pytest.raises(ValueError, match=op + " needs a grouped weight"):
        cuda_gemm_grouped.gemm_grouped_tma_spec(4, 512, per_channel, None, mx.bfloat16)
    grouped = QuantizedWeight.from_float(w[:, :512], 64, per_channel=False)
    with pytest.raises(ValueError, match=op + " M must be at least 1, got 0"):
        cuda_gemm_grouped.gemm_grouped_tma_spec(0, 512, grouped, None, mx.bfloat16)
    xq, xs, xr = cuda_quantize.quantize(x[:, :512], 64)
    assert xr.shape == (4, 8)
    with pytest.raises(ValueError, match=op + r" the group sums must be an int32 array of shape \(96,\)"):
        cuda_gemm_grouped.gemm_grouped_tma(xq, xs, xr, grouped, None, mx.bfloat16)
    with pytest.raises(ValueError, match=op + " the tile must be a GroupedTmaConfig"):
        cuda_gemm_grouped.gemm_grouped_tma_spec(4, 512, grouped, None, mx.bfloat16, cuda_tiles.TMA_CONFIGS["tma64"])
    # The pipelined promotion: runs the tile cannot take (spills at bn = 128), runs that
    # do not divide K / group_size (8 groups here), and with the MMA order.
    wide, narrow = cuda_tiles.GROUPED_TMA_CONFIGS["gtma128"], cuda_tiles.GROUPED_TMA_CONFIGS["gtma64"]
    for bad in (wide._replace(pipe=4), narrow._replace(pipe=3), narrow._replace(pipe=2, order=True)):
        with pytest.raises(ValueError, match=op + f" pipe must be one of .* got pipe={bad.pipe}"):
            cuda_gemm_grouped.gemm_grouped_tma_spec(4, 512, grouped, None, mx.bfloat16, bad)
    six = QuantizedWeight.from_float(mx.concatenate([w, w[:, :192]], axis=1), 128, per_channel=False)
    with pytest.raises(ValueError, match=op + " pipe .* divide K / group_size = 6"):
        cuda_gemm_grouped.gemm_grouped_tma_spec(4, 768, six, None, mx.bfloat16, narrow._replace(pipe=4))
    for good in (wide._replace(pipe=2), narrow._replace(pipe=4)):
        assert cuda_gemm_grouped.gemm_grouped_tma_spec(4, 512, grouped, None, mx.bfloat16, good)
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.cuda_quantize\] group_size"):
        cuda_quantize.quantize_groups(x, 48)


def _fma32(a, b, c):
    """float32 fma(a, b, c): the product of two float32 values is exact in float64, the
    sum rounded there and then to float32 (a double rounding: at most one float32 unit
    in the last place from the true fma, far inside the bounds checked here)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def test_grouped_tma_promotion_arithmetic_model(rng):
    """A float32 model of gemm_grouped_ws.cu's promotion, on the CPU. (1) float(P) is
    formed as the float32 whose bits are P + 0x4B400000, minus 1.5 * 2^23: exact for
    every P with |P| <= 127 * 128 * 128 (an int8 code times a signed weight code, over
    a group of 128), checked for each such P. (2) f = fma(o, R, fma(s, P, f)) over the
    G groups in K order, then y = t f, in float32, lies within gamma(2G + 4) T of the
    float64 value (docs/numerics.md: the gate's bound for grouped weights), on weights
    quantized by mx.quantize with all-zero groups (scale -1e-7: s P and o R then nearly
    cancel) and activations with all-zero groups, at every group size."""
    import mlx.core as mx

    import oracle

    lim = 127 * 128 * 128
    p = np.arange(-lim, lim + 1, dtype=np.int64)
    as_float = (p + 0x4B400000).astype(np.uint32).view(np.float32) - np.float32(12582912.0)
    assert np.array_equal(as_float.astype(np.int64), p)

    m, n, k = 6, 24, 1024
    for gs in cuda_tiles.GROUPED_TMA_GROUP_SIZES:
        groups = k // gs
        w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
        w += rng.uniform(-0.05, 0.05, (n, 1)).astype(np.float32)
        w[::4, :gs] = 0.0
        wq, scales, biases = mx.quantize(mx.array(w).astype(mx.bfloat16), gs, 8)
        codes = np.array(wq).view(np.uint8).reshape(n, k).astype(np.int64)
        s = np.array(scales.astype(mx.float32))
        o = (np.array(biases.astype(mx.float32)) + np.float32(128.0) * s).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(np.float32) * rng.uniform(0.1, 10, (m, 1)).astype(np.float32)
        x[:, gs:2 * gs] = 0.0
        q, t = oracle.quantize_rows(x)
        qg = q.astype(np.int64).reshape(m, groups, gs)
        u = np.einsum("mgk,ngk->mng", qg, codes.reshape(n, groups, gs))  # the wgmma's U
        r = qg.sum(-1)  # [M, G]
        pm = u - 128 * r[:, None, :]
        assert np.abs(pm).max() <= lim
        f = np.zeros((m, n), dtype=np.float32)
        for g in range(groups):
            pf = (pm[:, :, g] + 0x4B400000).astype(np.uint32).view(np.float32) - np.float32(12582912.0)
            f = _fma32(np.broadcast_to(s[:, g], (m, n)), pf, f)
            f = _fma32(np.broadcast_to(o[:, g], (m, n)), np.broadcast_to(r[:, g:g + 1].astype(np.float32), (m, n)), f)
        y = (t.astype(np.float32) * f).astype(np.float32)
        c = codes - 128
        exact = t.astype(np.float64) * (
            np.einsum("mng,ng->mn", pm.astype(np.float64), s.astype(np.float64))
            + r.astype(np.float64) @ o.astype(np.float64).T)
        mag = np.abs(t.astype(np.float64)) * (
            np.abs(q.astype(np.float64)) @ (np.abs(np.repeat(s, gs, axis=1).astype(np.float64) * c)
                                            + np.abs(np.repeat(o, gs, axis=1).astype(np.float64))).T)
        u32 = 2.0 ** -24
        rounds = 2 * groups + 4
        gamma = rounds * u32 / (1 - rounds * u32)
        err = np.abs(y.astype(np.float64) - exact)
        assert np.all(err <= gamma * mag + 1e-30), (gs, float((err - gamma * mag).max()))


# What each candidate compiles (registry.Candidate.variant) ------------------------------
_VARIANT_SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (128256, 4096),
                   (256, 66336)]  # Llama-3-8B's projections; K > U8_MAX_K (flipped codes)


def _variant_ms(rng) -> list[int]:
    """M from 1 to 4096: every M to 64 (the GEMV buckets, the 64-row tiles), both ends
    of every 64-row step after it (the tile choices see M only through whole 64- and
    128-row tiles) and 64 more drawn at random."""
    ms = set(range(1, 65))
    for j in range(1, 64):
        ms.update((64 * j + 1, 64 * (j + 1)))
    ms.update(int(m) for m in rng.integers(1, 4097, 64))
    return sorted(ms)


def _lazy_weight(n: int, k: int, fmt: str, gs: int):
    """A QuantizedWeight [n, k] whose arrays are never evaluated (the recorder launches
    nothing; LaunchSpec.bound is patched not to evaluate its tail)."""
    import mlx.core as mx

    from mlx_w8a8.weight import QuantizedWeight

    scales = mx.zeros((n, k // gs), dtype=mx.bfloat16)
    return QuantizedWeight(mx.zeros((n, k // 4), dtype=mx.uint32), scales, scales, gs,
                           per_channel=fmt == "per_channel")


def _variant_cases(rng):
    """``(scope, key, make)``: a problem of a CUDA candidate (alone, or a sibling launch
    on the members' summed problem), its key ``(candidate, members, variant)`` and
    ``make()`` making its launches. ``scope`` holds what is fixed for one layer (shape,
    format, dtype, bias, members)."""
    import mlx.core as mx

    from mlx_w8a8.kernels import registry
    from mlx_w8a8.kernels.registry import Problem

    ms = _variant_ms(rng)
    few = [1, 2, 3, 5, 9, 16, 17, 64, 65, 128, 129, 300, 512, 513, 1024, 2048, 2049, 4096]
    linear = [c for c in registry.all_candidates() if c.backend == "cuda" and c.op == "linear"]
    weights = {}

    def weight(n, k, fmt, gs):
        key = (n, k, fmt, gs)
        if key not in weights:
            weights[key] = _lazy_weight(n, k, fmt, gs)
        return weights[key]

    def alone(cand, problem, w, bias):
        def make():
            dtype = getattr(mx, problem.dtype)
            x = mx.zeros((problem.m, problem.k), dtype=dtype)
            _, quantize, apply = cand.bind_stages(problem, w, bias)
            return apply(x) if quantize is None else apply(quantize(x))
        return make

    def group(cand, problem, members):
        def make():
            x = mx.zeros((problem.m, problem.k), dtype=getattr(mx, problem.dtype))
            _, quantize, apply = cand.bind_group(problem, members, None)
            return apply(x) if quantize is None else apply(quantize(x))
        return make

    layers = []  # (n, k, fmt, gs, dtype, bias, ms)
    for n, k in _VARIANT_SHAPES:
        gs = 32 if k % 64 else 64
        layers.append((n, k, "per_channel", gs, "bfloat16", False, ms))
        for dtype in ("float16", "float32"):
            layers.append((n, k, "per_channel", gs, dtype, False, few))
        layers.append((n, k, "grouped", gs, "bfloat16", False, few))
    layers.append((4096, 4096, "per_channel", 64, "bfloat16", True, few))
    layers.append((4096, 4096, "grouped", 64, "float32", True, few))
    for n, k, fmt, gs, dtype, has_bias, m_list in layers:
        w = weight(n, k, fmt, gs)
        bias = mx.zeros((n,), dtype=mx.bfloat16) if has_bias else None
        for m in m_list:
            problem = Problem("linear", m, n, k, dtype, fmt, gs, has_bias)
            for cand in linear:
                if cand.supports(problem):
                    yield ((cand.name, n, k, fmt, dtype, has_bias, 1),
                           (cand.name, 1, cand.variant(problem)), alone(cand, problem, w, bias))
    # sibling launches: q/k/v and gate/up of Llama-3-8B (q/k/v also with a bias)
    for ns, has_bias, m_list, fmt in (((4096, 1024, 1024), False, ms, "per_channel"),
                                      ((14336, 14336), False, ms, "per_channel"),
                                      ((4096, 1024, 1024), True, few, "per_channel"),
                                      ((4096, 1024, 1024), False, few, "grouped"),
                                      ((14336, 14336), True, few, "grouped")):
        members = [(weight(n, 4096, fmt, 64),
                    mx.zeros((n,), dtype=mx.bfloat16) if has_bias else None) for n in ns]
        for m in m_list:
            problem = Problem("linear", m, sum(ns), 4096, "bfloat16", fmt, 64, has_bias)
            for cand in linear:
                if cand.bind_group is not None and cand.supports(problem):
                    yield ((cand.name, ns, has_bias, fmt),
                           (cand.name, len(ns), cand.variant(problem)), group(cand, problem, members))
    # the int8 GEMMs and the quantize kernel
    for cand in registry.all_candidates():
        if cand.backend != "cuda" or cand.op == "linear":
            continue
        if cand.op == "int8_matmul":
            for n, k in _VARIANT_SHAPES[:4]:
                b = mx.zeros((n, k), dtype=mx.int8)
                for m in ms:
                    problem = Problem("int8_matmul", m, n, k, "int8", "int8")
                    if cand.supports(problem):
                        a = mx.zeros((m, k), dtype=mx.int8)
                        yield ((cand.name, n, k), (cand.name, 1, cand.variant(problem)),
                               lambda c=cand, a=a, b=b: c.run(a, b))
            continue
        for k in (4096, 14336, 66336):
            for dtype in ("bfloat16", "float32"):
                for gs in (None, 32):
                    for m in few:
                        problem = Problem("quantize_activation", m, 0, k, dtype, "int8", gs)
                        x = mx.zeros((m, k), dtype=getattr(mx, dtype))
                        yield ((cand.name, k, dtype, gs), (cand.name, 1, cand.variant(problem)),
                               lambda c=cand, x=x, gs=gs: c.run(x, gs))


def _compiled(launches) -> frozenset:
    """What MLX compiles for these launches: each kernel's name and template arguments,
    with the dtypes of its arguments (they are in the text it compiles)."""
    return frozenset((p["mlx_name"], repr(p["template"]),
                      tuple(str(a.dtype) for a in p["arrays"]),
                      tuple(str(d) for d in p["output_dtypes"])) for p in launches)


def test_variants_name_what_each_launch_compiles(cuda_here, monkeypatch, rng):
    """Every CUDA candidate's variant (registry.Candidate.variant, what mlx_w8a8.warm_up
    keys its calls on), recorded on CPU over M = 1..4096 (every tile and GEMV regime)
    on the Llama-3-8B shapes and a K > U8_MAX_K one, each format, dtype and bias, and
    the q/k/v and gate/up sibling launches: equal keys (candidate, members, variant)
    launch exactly the same compiled kernels (name, template, argument dtypes), across
    shapes too: a key that hid a change would leave a compile for a later call. And,
    for one layer, different kernels have different keys (no needless warm-up call)."""
    rec = cuda_here
    monkeypatch.setattr(launch.LaunchSpec, "bound",
                        lambda self, outputs=slice(None): lambda *lead: self.launch(*lead)[outputs])
    by_key, keys_of, errors, count = {}, {}, {}, 0
    for scope, key, make in _variant_cases(rng):
        start = len(rec.launches)
        make()
        got = _compiled(rec.launches[start:])
        assert got, (scope, key)
        count += 1
        first = by_key.setdefault(key, (got, scope))
        if first[0] != got and key not in errors:
            errors[key] = f"{key}: {sorted(first[0] ^ got)} ({first[1]} vs {scope})"
        keys_of.setdefault((scope, got), set()).add(key)
    assert not errors, "\n".join(list(errors.values())[:4])
    split = {s: k for s, k in keys_of.items() if len(k) > 1}
    assert not split, list(split.items())[:3]
    names = {key[0] for key in by_key}
    assert len(names) == 15 and count > 5000, (sorted(names), count)  # no grouped4 layer here


def test_a_new_input_shape_leaves_few_objects_for_the_collector(cuda_here):
    """Every object a layer keeps for an input shape is one more for Python's cyclic
    collector to promote and, at its next full collection, scan: at new prompt lengths
    (a server's) those collections took 245-301 ms per ten 32-layer Llama-3-8B prefills
    on an NVIDIA H200's host (2026-12-02), about half of such a prefill's host time.
    q/k/v (one sibling launch) and o meet a new input shape,
    on the warp-specialized GEMM as at prefill; the collector-tracked objects still alive
    afterwards (the launch recorder's own records aside) do not grow with the layers: a
    layer keeps no plan at a shape met once (plans.PlanCache.keep), only the shape's key,
    which the collector stops tracking. What is left is per shape (under 64 objects
    here): the launch frames and decisions every layer of that shape shares. Plans kept
    from the first call left 34 per layer call (as bound methods of slotted objects) and
    43 (as closures)."""
    import gc

    import mlx.core as mx
    import mlx.nn as nn

    import mlx_w8a8 as w8
    import mlx_w8a8.nn as w8nn
    from mlx_w8a8.kernels import registry

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(64, 64, bias=False)
            self.k_proj = nn.Linear(64, 32, bias=False)
            self.v_proj = nn.Linear(64, 32, bias=False)
            self.o_proj = nn.Linear(64, 64, bias=False)

        def __call__(self, x):
            q, _, _ = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            return self.o_proj(q)

    ws = registry.get("linear", "cuda_w8a8_gemm_ws")
    previous = registry.set_chooser(lambda problem, found: (ws, "stub") if ws in found else None)
    try:
        blocks = [Attention() for _ in range(4)]
        for block in blocks:
            w8.quantize(block)
        for t in (8, 9, 10):  # kernels, launch frames and decisions made before
            for block in blocks:
                block(mx.zeros((1, t, 64), dtype=mx.bfloat16))

        def kept_at_new_shape(t, layers):
            w8nn.clear_shared_activations()
            gc.collect()
            before = {id(o) for o in gc.get_objects()}
            x = mx.zeros((1, t, 64), dtype=mx.bfloat16)
            for block in layers:
                block(x)
            assert len(cuda_here.launches) > 0
            del x, cuda_here.launches[:]  # the recorder's records are the test's
            w8nn.clear_shared_activations()
            # Twice: the first stops tracking the new keys (tuples of ints and a dtype),
            # the second the layers' own decision dicts that only such keys fill (CPython
            # untracks those); a dict tracked again by a new key is not a new object.
            gc.collect()
            gc.collect()
            return [o for o in gc.get_objects() if id(o) not in before]

        one = kept_at_new_shape(20, blocks[:1])
        every = kept_at_new_shape(21, blocks)
    finally:
        registry.set_chooser(previous)
    per_layer_call = (len(every) - len(one)) / (4 * (len(blocks) - 1))
    counts = collections.Counter(type(o).__name__ for o in every).most_common(8)
    assert per_layer_call < 0.5, (per_layer_call, counts)
    assert len(every) < 64, counts  # the shape's launch frames and decisions, shared


# The 4-bit GEMV's nibble expansion, run on the host -----------------------------------------
_HOST_INTRINSICS = r"""
#include <cstdint>
#include <cstdio>
struct uint4 { uint32_t x, y, z, w; };
#define __device__
#define __forceinline__ inline
// PTX prmt (default mode): byte i of the result is byte (selector nibble i & 7) of {y, x}.
static uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t v = (uint64_t(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
// dp4a.s32.s32: the four signed byte products added to c.
static int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += int8_t(a >> (8 * i)) * int8_t(b >> (8 * i));
  return c;
}
"""


def _device_function(text: str, name: str) -> str:
    start = re.search(rf"__device__ __forceinline__ \w+ {name}\(", text).start()
    return text[start:text.index("\n}\n", start) + 3]


def test_gemv_4bit_expansion_on_the_host(tmp_path, rng):
    """gemv.cu's own expand_chunk4 and dot16_codes, compiled for the host with prmt and
    dp4a written out as the PTX ISA defines them: 32 codes packed as MLX packs them
    (checked with the package's unpack4) dotted with 32 activation codes
    give sum x_i q_i for random and extreme codes. A wrong selector or nibble order (code
    2i + 1 taken for 2i) fails it."""
    import mlx.core as mx

    from mlx_w8a8.weight import unpack4

    cxx = os.environ.get("MLX_W8A8_EMU_CXX") or shutil.which("clang++") or shutil.which("g++")
    assert cxx, "a host C++ compiler (clang++ or g++) is needed: apt-get install clang"
    text = launch.load("gemv.cu")[0]
    trials = 2000
    codes = rng.integers(0, 16, (trials, 32)).astype(np.uint8)
    codes[0], codes[1] = 15, np.arange(32) % 16
    x = rng.integers(-127, 128, (trials, 32)).astype(np.int8)
    x[0] = 127
    words = np.zeros((trials, 4), dtype=np.uint32)
    for i in range(32):
        words[:, i // 8] |= codes[:, i].astype(np.uint32) << np.uint32(4 * (i % 8))
    # MLX's packing (weight.unpack4, held to mx.quantize / mx.dequantize by test_w4a8.py)
    assert np.array_equal(np.array(unpack4(mx.array(words))), codes)
    program = _HOST_INTRINSICS + "".join(_device_function(text, f) for f in (
        "dot16_codes", "expand_word4", "expand_chunk4")) + r"""
int main() {
  uint32_t w[4], xw[8];
  while (scanf("%u %u %u %u", &w[0], &w[1], &w[2], &w[3]) == 4) {
    for (int i = 0; i < 8; ++i) scanf("%u", &xw[i]);
    uint4 first, second;
    expand_chunk4(uint4{w[0], w[1], w[2], w[3]}, first, second);
    const uint4 x0{xw[0], xw[1], xw[2], xw[3]}, x1{xw[4], xw[5], xw[6], xw[7]};
    printf("%d\n", dot16_codes(x1, second, dot16_codes(x0, first, 0)));
  }
  return 0;
}
"""
    (tmp_path / "expand.cpp").write_text(program)
    exe = tmp_path / "expand"
    subprocess.run([cxx, "-std=c++17", "-O1", str(tmp_path / "expand.cpp"), "-o", str(exe)],
                   check=True, capture_output=True)
    xw = x.view(np.uint32)
    feed = "\n".join(" ".join(str(v) for v in (*w, *a)) for w, a in zip(words, xw))
    out = subprocess.run([str(exe)], input=feed, capture_output=True, text=True, check=True)
    got = np.array(out.stdout.split(), dtype=np.int64)
    want = (x.astype(np.int64) * codes.astype(np.int64)).sum(axis=1)
    np.testing.assert_array_equal(got, want)


# The dequantizing GEMM's launch plan (no GPU) ---------------------------------------------
def test_dequant_tiles_fit_shared_memory():
    """Every tile at both code widths: the ring's stages keep the swizzle's 1024-byte
    alignment, and the dynamic shared memory fits sm_90's 227 KiB (a launch asking for
    more fails at run time, not here)."""
    for cfg in cuda_tiles.DEQUANT_CONFIGS.values():
        for bits in (8, 4):
            assert cfg.stage_bytes(bits) % 1024 == 0, (cfg, bits)
            assert cfg.shared_memory(bits) <= 227 * 1024, (cfg, bits, cfg.shared_memory(bits))


def test_dequant_refuses_with_the_reason(monkeypatch):
    """What the dequantizing GEMM cannot run, each refusal naming the kernel, the value
    and what is valid; a valid problem is accepted (on a patched Hopper probe)."""
    from mlx_w8a8.kernels.cuda.gemm_dequant import DequantGemm
    from mlx_w8a8.kernels.registry import Problem

    monkeypatch.setattr(launch, "is_sm90", lambda: True)
    kern = DequantGemm()
    assert kern.can_implement(Problem("linear", 300, 392, 1152, "bfloat16", "grouped4", 32)) == (True, "")
    cases = {
        Problem("linear", 8, 64, 1024, "float32", "grouped", 64): "activation dtype must be one of",
        Problem("linear", 8, 64, 1056, "bfloat16", "grouped", 32): "K must be a positive multiple of 64, got 1056",
        Problem("linear", 8, 64, 1024, "float16", "per_channel", 64): "weight format must be one of",
    }
    for problem, why in cases.items():
        ok, reason = kern.can_implement(problem)
        assert not ok and reason.startswith("[mlx_w8a8.cuda_dequant_gemm]") and why in reason, reason
    monkeypatch.setattr(launch, "is_sm90", lambda: False)
    ok, reason = kern.can_implement(Problem("linear", 8, 64, 1024, "bfloat16", "grouped", 64))
    assert not ok and "compute capability 9.x" in reason


def test_dequant_spec_takes_the_stored_terms_or_rounds_them_once(monkeypatch):
    """The launch reads the weight's own scales and biases where they are in x's dtype;
    in another dtype a copy rounded once, kept with the weight (the same arrays on the
    next launch); a dtype or K it cannot run is a ValueError naming the kernel."""
    import mlx.core as mx

    record_launches(monkeypatch)  # the spec builds its kernel object; nothing launches
    launch._kernel.cache_clear()

    from mlx_w8a8.kernels.cuda import gemm_dequant
    from mlx_w8a8.weight import QuantizedWeight

    w = mx.random.normal((128, 256))
    for bits in (8, 4):
        same = QuantizedWeight.from_float(w.astype(mx.bfloat16), 64, per_channel=False, bits=bits)
        spec = gemm_dequant.gemm_dequant_spec(5, 256, same, None, mx.bfloat16)
        assert spec.tail[1] is same.scales and spec.tail[2] is same.biases
        assert dict(spec.template)["BITS"] == bits and dict(spec.template)["GS"] == 64
        other = QuantizedWeight.from_float(w, 64, per_channel=False, bits=bits)  # float32 terms
        first = gemm_dequant.gemm_dequant_spec(5, 256, other, mx.ones((128,)), mx.float16)
        again = gemm_dequant.gemm_dequant_spec(300, 256, other, None, mx.float16)
        assert first.tail[1].dtype == mx.float16 and first.tail[1] is again.tail[1]
        assert first.tail[4].dtype == mx.float32  # the bias, as every CUDA linear reads it
        # The two maps' prototypes: x as [bn, 2K] bytes in bn-row boxes of 128 bytes
        # (128-byte swizzle; the kernel writes M in), the codes as [N, K bits / 8] bytes
        # in 128-row boxes of 8 bits bytes with the swizzle of that span (dq_wswz).
        for spec_, m in ((first, 5), (again, 300)):
            bn = dict(spec_.template)["BN"]
            assert bn == gemm_dequant.dequant_tile_for(m, 128).bn
            assert read_prototypes(spec_.tail[3]) == [(bn, 512, bn),
                                                      (128, 256 * bits // 8, 128)]
            assert np.array(spec_.tail[3]).tobytes()[128 + 24:128 + 40] == np.array(
                [8 * bits, 8 * bits], dtype=np.uint64).tobytes()
            # One scratch slot of two maps per block, + 128 bytes to align the first.
            blocks = spec_.grid[0] // spec_.threadgroup[0]
            assert blocks == -(-m // bn)  # one feature tile (N = 128) per token tile
            assert spec_.output_shapes[1] == ((2 * blocks + 1) * 128,)
            assert spec_.output_dtypes[1] == mx.uint8
        assert mx.array_equal(first.tail[1], other.scales.astype(mx.float16)).item()
    for args, why in (((5, 256, same, None, mx.float32), "the activation dtype"),
                      ((5, 192, same, None, mx.bfloat16), "K must be the weight")):
        with pytest.raises(ValueError, match=r"\[mlx_w8a8.cuda_dequant_gemm\] " + why):
            gemm_dequant.gemm_dequant_spec(*args)
    launch._kernel.cache_clear()


def test_digests_follow_every_module_of_the_cuda_package():
    """``DIGEST_MODULES`` names every module of ``mlx_w8a8.kernels.cuda`` (and the
    tensor-map encoder): a kernel family added as a new module has its launch helpers
    followed by its digest without anyone listing them (one left out, as
    ``gemm_dequant`` would be, fails here)."""
    import pkgutil

    package = cuda.__name__
    modules = {package} | {f"{package}.{m.name}" for m in pkgutil.iter_modules(cuda.__path__)}
    assert modules <= set(cuda_kernel.DIGEST_MODULES), sorted(modules - set(cuda_kernel.DIGEST_MODULES))
