"""CUDA launchers and tile policy: the kernels of ``shaders/cuda/*.cu`` through
``mx.fast.cuda_kernel``.

Kernel source files hold a header and one or more named bodies (:func:`sources.split`);
MLX wraps each body into a ``__global__`` function (``mlx/backend/cuda/custom_kernel.cpp``).
Sizes reach the kernels through MLX's ``<input>_shape`` arguments, so no scalar arrays
are created per call. Registration as tuner candidates is :mod:`mlx_w8a8.kernels.cuda`'s
job; this module only builds and launches kernels (importing it never needs CUDA).

Each linear launch is described by a :class:`LaunchSpec` (``*_spec``) computed from the
problem's sizes, dtype and weight; the launchers (``quantize``, ``gemm_per_channel``, ...)
build it on every call, the ``bind_*`` functions once, returning closures that only launch.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import mlx.core as mx
import numpy as np

from .. import cachedir
from . import sources, tensormap

# Weight codes are read as 16-byte vectors: K must be a multiple of 16 for the GEMMs
# (the int8 operands) and of 8 for the quantize kernel (8 floats per vector step).
GEMM_K_MULTIPLE = 16
QUANT_K_MULTIPLE = 8
# |a|, |b| <= 128: K * 2^14 < 2^31 keeps the int32 accumulator exact.
MAX_K = 1 << 17
# The per-channel GEMM multiplies int8 activations (|a| <= 127) by the UNSIGNED weight codes
# (q <= 255) and subtracts 128 * sum_k a_k afterwards: the unsigned int32 sum is exact only
# while K * 127 * 255 < 2^31, i.e. K <= 66311. Above that the codes are flipped to int8.
U8_MAX_K = (2**31 - 1) // (127 * 255)
assert U8_MAX_K == 66311
GEMV_MAX_M = 16
FLOAT_DTYPES = ("float16", "bfloat16", "float32")
# The unsigned-code GEMMs' activations travel as one int8 array [R, K] (codes, float32
# scales, int32 row sums: shaders/cuda/shape.cuh), R = M + ceil(8 M / K); R is one of
# MLX's int32 dimensions.
ROWSUM_MAX_ROWS = 2**31 - 1
ROWSUM_MAP_AREA = 256  # shape.cuh kRowsumMapArea: 128 map bytes + up to 127 to align them


def _own(file: str) -> tuple[str, dict[str, str]]:
    """One file's own header and bodies; a ``.cuh`` file is all header, no bodies."""
    text = sources.read("cuda", file)
    return (text, {}) if file.endswith(".cuh") else sources.split(text, "cuda")


@functools.lru_cache(maxsize=None)
def requires(file: str) -> tuple[str, ...]:
    """``file`` after every file its header requires (``// @@ requires OTHER``, followed
    transitively), each once, a file after everything it requires.

    Raises:
        ValueError: on a cycle of requirements.
    """
    order: list[str] = []

    def visit(f: str, chain: tuple[str, ...]) -> None:
        if f in chain:
            raise ValueError(f"[mlx_w8a8.cuda] kernel files require each other: "
                             f"{' -> '.join(chain + (f,))}")
        if f in order:
            return
        for other in sources.REQUIRES.findall(_own(f)[0]):
            visit(other, chain + (f,))
        order.append(f)

    visit(file, ())
    return tuple(order)


@functools.lru_cache(maxsize=None)
def load(file: str) -> tuple[str, dict[str, str]]:
    """Header and bodies of ``shaders/cuda/<file>`` as passed to ``mx.fast.cuda_kernel``.

    The header is the headers of :func:`requires` (``.cuh`` files: shared code, no
    bodies), each once, then the file's own, so a body carries only the code its file
    names; comments are stripped (:func:`sources.strip_comments`). MLX handles the whole
    text on every launch, so its length costs per launch (docs/cuda.md).
    """
    header = "".join(_own(f)[0] for f in requires(file))
    return (sources.strip_comments(header),
            {k: sources.strip_comments(v) for k, v in _own(file)[1].items()})


def cuda_available() -> bool:
    """True when MLX has a CUDA device and uses the GPU by default."""
    try:
        return bool(mx.cuda.is_available()) and mx.default_device().type == mx.gpu
    except Exception:  # a CPU-only build without mx.cuda, or a broken probe
        return False


@functools.lru_cache(maxsize=None)
def is_sm90() -> bool:
    """Whether the default GPU is compute capability 9.x (wgmma needs sm_90a)."""
    try:
        return int(mx.device_info().get("compute_capability_major", 0)) == 9
    except Exception:
        return False


# Tile policy ------------------------------------------------------------------------------
class GemmConfig(NamedTuple):
    """Tile shape of the tensor-core GEMM.

    ``bm x bn`` block tile, ``wtm x wtn`` warp tile, ``stages`` cp.async ring depth;
    ``wgmma``: the Hopper warpgroup kernel (``gemm_wgmma.cu``, fixed 128 x 256 tile,
    two warpgroups) instead of ``mma.sync`` (``gemm.cu``).
    """

    bm: int
    bn: int
    wtm: int
    wtn: int
    stages: int
    wgmma: bool = False

    @property
    def file(self) -> str:
        return "gemm_wgmma.cu" if self.wgmma else "gemm.cu"

    @property
    def threads(self) -> int:
        if self.wgmma:
            return 256
        return (self.bm // self.wtm) * (self.bn // self.wtn) * 32

    @property
    def shared_memory(self) -> int:
        # wgmma: + 1024 bytes so the tile base can be rounded up to a 1024-byte boundary.
        return self.stages * (self.bm + self.bn) * 128 + (1024 if self.wgmma else 0)

    def template(self) -> list[tuple[str, int]]:
        if self.wgmma:  # fixed tile: only the ring depth is a parameter
            return [("STAGES", self.stages)]
        return [("BM", self.bm), ("BN", self.bn), ("WTM", self.wtm), ("WTN", self.wtn),
                ("STAGES", self.stages)]


class WsConfig(NamedTuple):
    """Tile of the warp-specialized persistent GEMM (``gemm_ws.cu``): 128 x ``bn``
    (``bn`` 256, 128, 64 or 32), a ``stages``-deep ring, 8 consumer warps and
    ``producers`` producer warps (1, 2 or 4); at most one block per SM. ``tma``: the
    producer issues TMA tile loads (one warp; the ``tma_*`` bodies, which also take
    the weights' map arrays, :func:`weight_maps`) instead of cp.async copies.
    ``pingpong``: each consumer warpgroup computes whole tiles, the two taking turns, so
    one's epilogue overlaps the other's MMAs (``bn`` <= 128: a thread holds ``bn``
    accumulators); otherwise they share each tile (64 rows each). ``accumulators``
    (cooperative tiles, 1, 2 or 4, ``accumulators * bn <= 128``): independent
    accumulator sets the k-steps of a k-tile add into in turn, so a narrow tile's
    wgmmas do not each wait for the one before (summed before the epilogue)."""

    bn: int
    stages: int
    producers: int = 4
    tma: bool = False
    pingpong: bool = False
    accumulators: int = 1

    file = "gemm_ws.cu"
    bm = 128

    @property
    def threads(self) -> int:
        return 256 + 32 * self.producers

    @property
    def shared_memory(self) -> int:
        # Ring + 8 per-warp epilogue staging buffers (2560 bytes) + full/empty mbarriers
        # and the ping-pong's two order mbarriers + 1024 bytes to round the ring's base up
        # to the 128-byte swizzle's 1024-byte atom; TMA: + room for 1 + MAX_SIBLINGS maps,
        # 128-byte aligned.
        maps = (1 + MAX_SIBLINGS + 1) * tensormap.MAP_BYTES if self.tma else 0
        return (self.stages * (self.bm + self.bn) * 128 + 8 * 2560 + 16 * self.stages + 16
                + 1024 + maps)

    def template(self) -> list[tuple[str, int]]:
        return [("BN", self.bn), ("STAGES", self.stages), ("PW", self.producers),
                ("PP", int(self.pingpong)), ("ACC", self.accumulators)]

    def body(self, name: str) -> str:
        """The body of ``gemm_ws.cu`` running ``name`` with this config's producer."""
        return "tma_" + name if self.tma else name


# Configurations the launchers pick from (tile_for / grouped_tile_for); the compile test
# builds each of them. 132 SMs on an H200.
GEMM_CONFIGS = {
    "wgmma": GemmConfig(128, 256, 64, 256, 4, True),
    "large": GemmConfig(128, 256, 64, 64, 3),
    "medium": GemmConfig(128, 128, 64, 64, 4),
    "small": GemmConfig(64, 128, 32, 64, 4),
    "grouped": GemmConfig(128, 128, 64, 32, 4),
    "grouped_small": GemmConfig(64, 128, 32, 32, 4),
}
# The warp-specialized kernel, each tile with a producer warpgroup (one producer warp
# measured 0.6x as fast: docs/cuda.md) and as many ring stages as fit next to the 20 KiB
# epilogue staging in an H200's 227 KiB: 4 x 48 KiB at 128 x 256, 6 x 32, 8 x 24, 10 x 20.
# 128 x 32 adds into 4 accumulator sets: 2-14% less GPU time than one at M = 16-512 on
# the Llama-3-8B shapes (NVIDIA H200, 2026-12-01: down_proj, K = 14336, at M = 16 34.5
# against 40.0 us); 2 sets on 128 x 64, and any on the TMA tiles, measured within 5%.
WS_CONFIGS = {
    "ws256p4": WsConfig(256, 4),
    "ws128p4": WsConfig(128, 6),
    "ws64p4": WsConfig(64, 8),
    "ws32p4": WsConfig(32, 10, accumulators=4),
}
# The TMA producer: lane 0 of warp 8 issues the tile loads. 128 x 256 and 128 x 128 come
# with a producer warpgroup (warps 9-11 idle) so that it can hand registers to the
# consumers (setmaxnreg: 40 per producer thread, 232 per consumer thread; at the kernel's
# 168 ptxas spilled up to 868 bytes in the bias and sibling bodies, none with it), 64 and
# 32 with one producer warp; as many ring stages as the cp.async tiles. 128 x 128 runs
# ping-pong consumers (WsConfig.pingpong). Measured on an H200 (2026-12-01; GPU
# time of the bf16-output GEMM): 4096 x 14336 at M = 2048 173.5 us ping-pong vs 185.0
# cooperative 128 x 256 and 211.6 cooperative 128 x 128 (dropped); 14336 x 4096 (K =
# 14336) 170.4 vs 158.0 with the 128 x 256 tile (tma_tile_for).
TMA_CONFIGS = {
    "tma256": WsConfig(256, 4, 4, True),
    "tma128pp": WsConfig(128, 6, 4, True, True),
    "tma64": WsConfig(64, 8, 1, True),
    "tma32": WsConfig(32, 10, 1, True),
    "tma128": WsConfig(128, 6, 4, True),
}
# tma_tile_for runs 128 x 128 tiles with cooperative consumers (tma128) where the grid has
# at most one tile per block: a ping-pong block's second warpgroup has no tile to take
# there, and one warpgroup then issues every MMA of the tile. Measured on an H200
# (2026-12-01; GPU time of the bf16-output GEMM, ping-pong -> cooperative):
# M = 512 on 4096 x 4096 18.7 -> 17.2 us, 14336 x 4096 45.7 -> 44.4, 18944 x 3584 57.1 ->
# 55.4, M = 128 on 4096 x 14336 24.9 -> 23.4; with two or more tiles per block ping-pong
# wins or ties (M = 512 on 4096 x 14336: 51.4 against 58.7; M = 1024: 28.9-113.2 against
# 29.8-113.7).
# tma_tile_for takes the ping-pong 128 x 128 tile instead of the cooperative 128 x 256
# up to this K: a tile's epilogue (hidden by ping-pong) is a share of its MMAs that falls
# as 1 / K, while the narrower tile reads 4/3 the operand bytes per MMA from L2. Measured
# at K = 4096 (ping-pong faster) and 14336 (slower); not between them.
PINGPONG_MAX_K = 8192
# A persistent tile choice fills the GPU when the output has at least this fraction of
# one tile per SM (tiles_filling).
WAVE_FILL = 0.8
# Members of one sibling launch (gemm_ws.cu's group bodies): q/k/v or gate/up.
MAX_SIBLINGS = 3
SMS = 132  # persistent grid size (an H200's SM count; any GPU runs it correctly)
# Use the wgmma kernel on compute capability 9.x (sm_90a) for the large tile; the
# environment variable MLX_W8A8_CUDA_WGMMA=0 turns it off (mma.sync everywhere).
PREFER_WGMMA = os.environ.get("MLX_W8A8_CUDA_WGMMA", "1") != "0"
ALL_GEMM_CONFIGS = dict(GEMM_CONFIGS)  # the compile test builds every shipped kernel
if not PREFER_WGMMA:
    del GEMM_CONFIGS["wgmma"]


def tiles(m: int, n: int, cfg: GemmConfig | WsConfig) -> int:
    """Output tiles of an ``M x N`` result under ``cfg``."""
    return -(-m // cfg.bm) * -(-n // cfg.bn)


def tile_for(m: int, n: int) -> GemmConfig:
    """The per-channel / int32 GEMM tile for an ``M x N`` output: the 128 x 256 tile once
    it gives at least ~48 blocks (on an H200, mma.sync 128 x 256 beat 128 x 128 even at
    M = 512, N = 4096: 29.5 vs 33.8 us; the wgmma kernel, 22.2 us there, is used on
    Hopper), else smaller mma.sync tiles so more SMs get work."""
    large = GEMM_CONFIGS["large"]
    if tiles(m, n, large) >= 48:
        return GEMM_CONFIGS["wgmma"] if PREFER_WGMMA and is_sm90() else large
    if m > 64:
        return GEMM_CONFIGS["medium"]
    return GEMM_CONFIGS["small"]


def tiles_filling(m: int, n: int, configs) -> WsConfig:
    """The widest of ``configs`` whose ``M x N`` output has at least ``WAVE_FILL * SMS``
    tiles, else the narrowest (the most tiles there are).

    Measured on an H200 with the kernels' own GPU time (CUPTI, ``bench/tile_gpu_time.py``,
    docs/cuda.md): a persistent grid of fewer tiles than SMs leaves the rest idle and each
    busy SM streams more of the weight, so at M = 128 on 4096 x 4096 the 128 x 32 tile
    takes 12.7 us against 33.4 for 128 x 256 (16 tiles); once the tiles fill the SMs the
    wider tile wins (M = 512, N = 14336: 128 x 256, 224 tiles, 70 us against 83 for
    128 x 128). The wall clock of chains of independent launches, which MLX may run side
    by side, had hidden the idle SMs (the earlier rule, 128 x 256 wherever N > 128, came
    from such timings)."""
    ordered = sorted(configs, key=lambda c: -c.bn)
    for cfg in ordered:
        if tiles(m, n, cfg) >= WAVE_FILL * SMS:
            return cfg
    return ordered[-1]


def ws_tile_for(m: int, n: int) -> WsConfig:
    """The warp-specialized GEMM's tile for an ``M x N`` output (:func:`tiles_filling`
    over ``WS_CONFIGS``)."""
    return tiles_filling(m, n, WS_CONFIGS.values())


def tma_tile_for(m: int, n: int, k: int) -> WsConfig:
    """The TMA GEMM's tile for an ``M x N`` output over ``K``: :func:`tiles_filling` over
    one tile per width (``TMA_CONFIGS`` but ``tma128``), the ping-pong 128 x 128 tile for
    128 x 256 where ``K <= PINGPONG_MAX_K``, and the cooperative 128 x 128 tile instead
    of the ping-pong one where the output has at most one tile per block (``SMS``)."""
    cfg = tiles_filling(m, n, [c for name, c in TMA_CONFIGS.items() if name != "tma128"])
    if cfg.bn == 256 and k <= PINGPONG_MAX_K:
        cfg = TMA_CONFIGS["tma128pp"]
    if cfg.pingpong and tiles(m, n, cfg) <= SMS:
        return TMA_CONFIGS["tma128"]
    return cfg


def grouped_tile_for(m: int, n: int) -> GemmConfig:
    """The grouped GEMM tile (float accumulators too, so smaller warp tiles)."""
    return GEMM_CONFIGS["grouped"] if m > 64 else GEMM_CONFIGS["grouped_small"]


# At most 512 threads per quantize block: a block must fit the SM's 64 K registers, and
# the block-per-row bodies use 66-76 per thread (ptxas for sm_90a; 1024 threads would need
# at most 64, and a block that does not fit fails to launch with no error from MLX).
# tests/test_cuda_compile.py checks the product. Rows longer than the threads' register
# cache (K > 32768 for 16-bit T, 16384 for float32) re-read their remaining chunks.
QUANT_MAX_THREADS = 512


def quant_cached(dtype: mx.Dtype) -> int:
    """Chunks of 8 elements each quantize thread keeps in registers (quantize.cu
    ``kCached``: 32 registers, 8 chunks of 16-bit elements or 4 of float32)."""
    return 4 if dtype == mx.float32 else 8


QUANT_WARP_THREADS = 256  # rowsum_warp: 8 rows per block
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


# Kernel objects -------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _kernel(file: str, body: str, inputs: tuple[str, ...], outputs: tuple[str, ...],
            shared_memory: int = 0):
    """The ``mx.fast.cuda_kernel`` for body ``body`` of ``shaders/cuda/<file>``, built once.

    Hazard: MLX finds a compiled kernel by its name and template arguments, in memory
    and in its on-disk cache (``$TMPDIR/mlx/<MLX version>/ptx/``, kept across processes);
    up to MLX 0.32.0 by the name alone, so two versions of a kernel under one name ran
    whichever was compiled first (``docs/cuda.md``). The name therefore ends with a digest
    of the text MLX is given (header, body, argument names): new text, new name, fresh
    compile, on every MLX version.
    """
    header, bodies = load(file)
    stem = file.removesuffix(".cu")
    text = sources.digest(header, bodies[body], ",".join(inputs), ",".join(outputs))
    return mx.fast.cuda_kernel(
        name=f"w8a8_{stem}_{body}_{text[:12]}",
        input_names=list(inputs),
        output_names=list(outputs),
        source=bodies[body],
        header=header_include(stem, header),
        ensure_row_contiguous=True,
        shared_memory=shared_memory,
    )


@functools.lru_cache(maxsize=None)
def header_include(stem: str, header: str) -> str:
    """The header handed to MLX for ``header``: ``#include "<path>"`` of a file holding
    it, written once under the cache folder ``cuda/`` and named by its digest; the
    header itself where no folder can be written.

    MLX copies the header into a new string on every launch call and hashes that whole
    text on every evaluation (to find the compiled module); NVRTC reads an included file
    only when it compiles. Measured on an NVIDIA H200 (``bench/custom_kernel_cost.py``):
    32 KiB of inline text cost 3.7 us per launch to build and 11.6 us to evaluate, a
    one-line include 1.4 and 4.0 us. The kernel's name carries the digest of the whole
    text (:func:`_kernel`), so MLX never pairs a compiled module with another text.

    Hazard: the file must exist whenever MLX compiles a kernel that includes it, which is
    at the first evaluation of each template instantiation, possibly long after this
    call. It is (re)written whenever its content is not exactly ``header`` and lives in
    the user cache directory (the temporary directory only where that cannot be
    written); deleting it while a process runs fails that process's later compiles.
    """
    try:
        folder = cachedir.folder("cuda")
    except OSError:
        return header
    path = os.path.abspath(os.path.join(folder, f"w8a8_{stem}_{sources.digest(header)}.cuh"))
    if '"' in path or "\n" in path or "\\" in path:  # not writable in an #include line
        return header
    try:
        with open(path, encoding="utf-8") as f:
            same = f.read() == header
    except OSError:
        same = False
    if not same:
        try:
            cachedir.write_text_atomic(path, header)  # whole or absent, whoever else writes
        except OSError:
            return header
    return f'#include "{path}"\n'


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


def _tma_io(cfg: WsConfig, k: int, ns: tuple[int, ...], blocks: int):
    """The int32 TMA body's extra input (the prototypes) and its scratch output's shape:
    one slot of 1 + G maps per block, + 128 bytes to align the first (gemm_ws.cu
    TmaMaps)."""
    scratch = ((1 + len(ns)) * blocks + 1) * tensormap.MAP_BYTES
    return _tma_prototypes(k, ns, cfg.bn), (scratch,)


WEIGHT_MAPS_BYTES = 4 * tensormap.MAP_BYTES


def weight_maps(weight, bn: int) -> mx.array:
    """``[512]`` uint8, the per-channel TMA GEMM's map array for ``weight`` on tiles
    ``bn`` wide: A's tensor-map prototype (``[128, K]`` codes), then the weight's
    (``[N, K]`` in ``bn``-row boxes), then 256 bytes where every launch writes the
    weight's map made from the address it receives (gemm_ws.cu TmaMaps). Made once per
    weight and tile width and kept with the weight (:meth:`QuantizedWeight.derived`): an
    input of every launch on it, where a scratch output would cost each launch about
    2.7 us of host time (docs/cuda.md "Host time per launch"). Every launch on the
    weight writes the same bytes there, also launches that run at once, so a launch
    reads only the map it made itself (tma.cuh)."""
    def make():  # made on the host whole: no graph to evaluate, also under mx.compile
        protos = _prototype_bytes(weight.k, (weight.n,), bn)
        raw = protos + bytes(WEIGHT_MAPS_BYTES - len(protos))
        return mx.array(np.frombuffer(raw, dtype=np.uint8))
    return weight.derived(("cuda_tma_maps", bn), make)


def _as_f32(a: mx.array) -> mx.array:
    return a if a.dtype == mx.float32 else a.astype(mx.float32)


# The per-channel GEMM's activation array ---------------------------------------------
# One launch output and one launch input instead of three: MLX's host cost per call
# grows with each array a launch names (docs/cuda.md "Host time per launch").
def rowsum_shape(m: int, k: int) -> tuple[int, int]:
    """The shape of the activation array of ``m`` rows of ``k`` codes: ``[R, k]`` int8,
    ``R = m + ceil((8 m + 256) / k)`` (the codes ``[m, k]``, then ``m`` float32 scales and
    ``m`` int32 row sums, then the map area, zeros where the TMA GEMM writes its map of
    the codes: ``shaders/cuda/shape.cuh``)."""
    return (m + -(-(8 * m + ROWSUM_MAP_AREA) // k), k)


def rowsum_rows_m(r: int, k: int) -> int:
    """The ``m`` of an activation array of ``r`` rows of ``k`` bytes (the inverse of
    :func:`rowsum_shape`, exact for every ``m``: ``r k = m (k + 8) + 256 + e``,
    ``0 <= e < k``; the kernels' ``rowsum_m``)."""
    return (r * k - ROWSUM_MAP_AREA) // (k + 8)


def _check_rowsum_rows(m: int, k: int) -> None:
    r = rowsum_shape(m, k)[0]
    if r > ROWSUM_MAX_ROWS:
        raise ValueError(f"[mlx_w8a8.cuda_quantize] {m} rows of K = {k} need an activation "
                         f"array of {r} rows, over MLX's {ROWSUM_MAX_ROWS}; split the batch")


def pack_rowsum(q: mx.array, scale: mx.array, row_sums: mx.array) -> mx.array:
    """The activation array of codes ``q`` (``[..., K]`` int8), scales ``scale``
    (``[..., 1]``, stored as float32) and row sums ``row_sums`` (``[..., 1]`` int32):
    what the ``rowsum`` quantize writes for the same values (:func:`quantize_rowsum`).
    For callers holding the three arrays (tests, :func:`gemm_per_channel`); the layers
    pass the quantize's array on as it is."""
    k = q.shape[-1]
    m = q.size // k
    r = rowsum_shape(m, k)[0]
    parts = [q.reshape(-1), _as_f32(scale).reshape(-1).view(mx.int8),
             row_sums.astype(mx.int32).reshape(-1).view(mx.int8)]
    parts.append(mx.zeros((r * k - m * (k + 8),), dtype=mx.int8))  # the map area
    return mx.concatenate(parts).reshape(r, k)


def unpack_rowsum(xa: mx.array, lead: tuple[int, ...] | None = None):
    """``(q, scale, row_sums)`` of an activation array (:func:`rowsum_shape`): ``[*lead, K]``
    int8, ``[*lead, 1]`` float32 and ``[*lead, 1]`` int32 (``lead``: ``(M,)`` by default)."""
    r, k = xa.shape
    m = rowsum_rows_m(r, k)
    lead = _lead(m, lead)
    flat = xa.reshape(-1)
    q = flat[: m * k].reshape(*lead, k)
    scale = flat[m * k: m * k + 4 * m].view(mx.float32).reshape(*lead, 1)
    sums = flat[m * k + 4 * m: m * k + 8 * m].view(mx.int32).reshape(*lead, 1)
    return q, scale, sums


# Launch specs ---------------------------------------------------------------------------
def _lead(m: int, lead: tuple[int, ...] | None) -> tuple[int, ...]:
    """The activation's leading shape: ``lead`` (``[*lead, K]``, ``prod(lead) == m``: the
    kernels read any rank, shape.cuh) or ``(m,)``."""
    if lead is None:
        return (m,)
    lead = tuple(lead)
    p = 1
    for d in lead:
        p *= d
    if p != m:
        raise ValueError(f"[mlx_w8a8.cuda] leading shape {lead} does not hold M = {m} rows")
    return lead


class LaunchSpec(NamedTuple):
    """One kernel launch with everything fixed but its leading (activation) inputs.

    Built from the problem's sizes, dtype and weight alone, so a layer builds it once
    (the ``bind_*`` functions) and each call only adds its activations: the launch is
    ``kernel(inputs=[*activations, *tail], template=..., ...)``.

    Args:
        kernel: the ``mx.fast.cuda_kernel`` object (:func:`_kernel`).
        tail: the inputs after the activations (weight codes, scales, float32 bias).
        template, output_shapes, output_dtypes, grid, threadgroup: as passed to MLX.
    """

    kernel: object
    tail: tuple
    template: list
    output_shapes: list
    output_dtypes: list
    grid: tuple
    threadgroup: tuple

    def launch(self, *lead: mx.array) -> list[mx.array]:
        """The launch on activations ``lead``: the kernel's outputs."""
        return self.kernel(
            inputs=[*lead, *self.tail], template=self.template,
            output_shapes=self.output_shapes, output_dtypes=self.output_dtypes,
            grid=self.grid, threadgroup=self.threadgroup,
        )

    def bound(self, outputs: slice = slice(None)):
        """``f(*lead) -> outputs``: :meth:`launch`, the outputs ``outputs`` selects, made
        directly on the first call and under ``mx.compile`` after it. The second call
        traces the launch; every later call replays the traced primitive on its own
        inputs, so MLX does not rebuild the launch (its kernel source string, template
        and argument lists) on each call. A spec is made for one input shape, and a
        shape met once (a server's prompt lengths) is never traced: a trace costs far
        more than the launch it records (0.02-0.1 ms per traced call on an NVIDIA H200's
        host, from a model benchmark's rounds, against 3.4-5 us for a direct launch).
        A compiled call has its own fixed cost, of the order of the launch it replaces:
        measured on an NVIDIA H200 (``bench/host_split.py``, 2026-12-01),
        a direct launch costs 3.4-5 us of Python, a W8A8 linear replaying each of its
        two launches 9.7-16.6 us (no clear gain), one compiled call for both
        (:func:`registry.fuse_stages`, which the layers use) 5.1-8.8.

        Hazard: ``mx.compile`` keeps an array a traced function captures as it was
        at the trace, and replays the graph of one that was unevaluated then on every
        call (a bias converted to float32 lazily, a weight not yet quantized). So the
        tail goes in as an input, and is evaluated here where it can be (not while an
        outer ``mx.compile`` traces it): a function that calls this launch inside its
        own ``mx.compile`` (:func:`registry.fuse_stages`) captures it evaluated.

        MLX traces again for another default stream, another input shape or dtype.
        Where compilation is off (``mx.disable_compile``, ``MLX_DISABLE_COMPILE``) or
        the inputs are tracers (an outer ``mx.compile``), the launch is made directly.
        """
        kernel, tail, template, shapes, dtypes, grid, tg = self
        try:
            mx.eval(tail)
        except ValueError:  # tracers of an outer mx.compile: nothing to evaluate
            pass

        def launch(lead, tail):
            return kernel(inputs=[*lead, *tail], template=template, output_shapes=shapes,
                          output_dtypes=dtypes, grid=grid, threadgroup=tg)[outputs]
        # [] before the first call, [None] after it, [the compiled launch] from the second
        # call on: a spec used once (a shape met once) never builds a compiled function.
        replay = []

        def call(*lead):
            if not replay:
                replay.append(None)
                return launch(lead, tail)
            if replay[0] is None:
                replay[0] = mx.compile(launch)
            return replay[0](lead, tail)
        return call


# Launch specs are cached per shape (the ``_*_frame`` functions), without the weight's
# arrays: every layer of one shape meets a new input shape with the same launch but for
# its weights, so the first builds it and the others only put their arrays in (a
# server's new prompt lengths: docs/cuda.md "Prompts of new lengths").
# A frame holds its kernel's ``_kernel`` arguments, not the kernel object, which is
# looked up on every use: whatever empties ``_kernel``'s cache (another kernel text in
# bench/cuda_bench.py, the tests' wrapped ``mx.fast.cuda_kernel``) reaches every spec.
_FRAMES = 4096


def _framed(frame: LaunchSpec, tail: tuple = ()) -> LaunchSpec:
    """The spec of a cached frame: its kernel built (or found) from the arguments it
    holds, ``tail`` (the weight's arrays) before the frame's own tail."""
    return frame._replace(kernel=_kernel(*frame.kernel), tail=tail + frame.tail)


def quantize_spec(m: int, k: int, dtype: mx.Dtype, group_size: int | None = None,
                  row_sum: bool = False, warp: bool = False,
                  lead: tuple[int, ...] | None = None) -> LaunchSpec:
    """The launch of :func:`quantize` for ``[M, K]`` ``dtype`` activations, or
    ``[*lead, K]`` ones (``prod(lead) == M``; outputs ``[*lead, ...]``)."""
    return _framed(_quantize_frame(m, k, dtype, group_size, row_sum, warp, _lead(m, lead)))


@functools.lru_cache(maxsize=_FRAMES)
def _quantize_frame(m: int, k: int, dtype: mx.Dtype, group_size: int | None, row_sum: bool,
                    warp: bool, lead: tuple[int, ...]) -> LaunchSpec:
    """:func:`quantize_spec` (no weight: the whole launch is shared)."""
    if k % QUANT_K_MULTIPLE:
        raise ValueError(f"[mlx_w8a8.cuda_quantize] K must be a multiple of {QUANT_K_MULTIPLE}, got {k}")
    if warp and (group_size is not None or not row_sum):
        raise ValueError("[mlx_w8a8.cuda_quantize] warp=True exists for row_sum=True, "
                         f"group_size=None only; got row_sum={row_sum}, group_size={group_size}")
    # Whole warps (row-sum shuffles), enough that each thread keeps its chunks of 8 in
    # registers between the two passes (quantize.cu kCached) where K allows.
    threads = min(QUANT_MAX_THREADS, max(32, -(-(k // 8) // (quant_cached(dtype) * 32)) * 32))
    template = [("T", dtype)]
    if row_sum and group_size is None:  # one output: the activation array (rowsum_shape)
        _check_rowsum_rows(m, k)
        shapes, dtypes = [rowsum_shape(m, k)], [mx.int8]
    if warp:
        rows = QUANT_WARP_THREADS // 32
        kern = ("quantize.cu", "rowsum_warp", ("x",), ("xa",))
        return LaunchSpec(kern, (), template, shapes, dtypes,
                          (-(-m // rows) * QUANT_WARP_THREADS, 1, 1), (QUANT_WARP_THREADS, 1, 1))
    if group_size is None and row_sum:
        kern = ("quantize.cu", "rowsum", ("x",), ("xa",))
    elif group_size is None:
        kern = ("quantize.cu", "plain", ("x",), ("q", "scale"))
        shapes, dtypes = [(*lead, k), (*lead, 1)], [mx.int8, mx.float32]
    else:
        kern = ("quantize.cu", "sums", ("x",), ("q", "scale", "row_sums"))
        template.append(("GS", group_size))
        shapes = [(*lead, k), (*lead, 1), (*lead, k // group_size)]
        dtypes = [mx.int8, mx.float32, mx.int32]
    return LaunchSpec(kern, (), template, shapes, dtypes, (m * threads, 1, 1), (threads, 1, 1))


def _grid(m: int, n: int, cfg: GemmConfig | WsConfig) -> int:
    """Blocks to launch: one per tile, or (persistent kernel) at most one per SM."""
    count = tiles(m, n, cfg)
    return min(count, SMS) if isinstance(cfg, WsConfig) else count


def _channel_tail(weight, bias) -> tuple:
    """A per-channel weight's inputs, in the order its bodies take them: codes, float32
    channel scales, float32 bias."""
    tail = (weight.q, weight.channel_scales)
    return tail if bias is None else tail + (_as_f32(bias),)


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
                                    unsigned, _lead(m, lead))
    tail = _channel_tail(weight, bias)
    if isinstance(cfg, WsConfig) and cfg.tma:  # + the weight's map array
        tail += (weight_maps(weight, cfg.bn),)
    return _framed(frame, tail)


@functools.lru_cache(maxsize=_FRAMES)
def _gemm_per_channel_frame(m: int, k: int, n: int, has_bias: bool, out_dtype: mx.Dtype,
                            cfg, unsigned: bool, lead: tuple[int, ...]) -> LaunchSpec:
    """:func:`gemm_per_channel_spec` for any weight of ``n`` rows on tile ``cfg`` (no
    tail: its inputs are all the weight's, :func:`_channel_tail`, and with a TMA tile
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
    grid = _grid(m, n, cfg)
    kern = (cfg.file, body, names, ("y",), cfg.shared_memory)
    return LaunchSpec(kern, (), [("T", out_dtype)] + cfg.template(), [(*lead, n)], [out_dtype],
                      (grid * cfg.threads, 1, 1), (cfg.threads, 1, 1))


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
    if not 2 <= len(members) <= MAX_SIBLINGS:
        raise ValueError(f"{op} a sibling launch takes 2 to {MAX_SIBLINGS} weights, "
                         f"got {len(members)}")
    has_bias = {b is not None for _, b in members}
    if len(has_bias) != 1:
        raise ValueError(f"{op} sibling weights must all have a bias or none, got "
                         f"{[b is not None for _, b in members]}")
    if k > U8_MAX_K:
        raise ValueError(f"{op} unsigned-code GEMM needs K <= {U8_MAX_K} (exact int32 "
                         f"sums), got {k}")
    for w, _ in members:
        if not w.per_channel or w.k != k:
            raise ValueError(f"{op} sibling weights must be per-channel with K = {k}, "
                             f"got format={w.format}, K={w.k}")
    ns = tuple(w.n for w, _ in members)
    cfg = config or ws_tile_for(m, sum(ns))
    frame = _gemm_ws_group_frame(m, k, ns, True in has_bias, out_dtype, cfg, _lead(m, lead))
    tail = tuple(a for w, b in members for a in _channel_tail(w, b))
    if cfg.tma:  # + each member's map array
        tail += tuple(weight_maps(w, cfg.bn) for w, _ in members)
    return _framed(frame, tail)


@functools.lru_cache(maxsize=_FRAMES)
def _gemm_ws_group_frame(m: int, k: int, ns: tuple[int, ...], has_bias: bool,
                         out_dtype: mx.Dtype, cfg, lead: tuple[int, ...]) -> LaunchSpec:
    """:func:`gemm_ws_group_spec` for any members of ``ns`` rows on tile ``cfg`` (no
    tail: its inputs are the members', :func:`_channel_tail` each, and with a TMA tile
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


def gemm_grouped_spec(m: int, weight, bias, out_dtype: mx.Dtype,
                      config: GemmConfig | None = None,
                      lead: tuple[int, ...] | None = None) -> LaunchSpec:
    """The launch of :func:`gemm_grouped` (activations ``xq, xs, xr``)."""
    frame = _gemm_grouped_frame(m, weight.n, bias is not None, weight.scales.dtype,
                                weight.group_size, out_dtype,
                                config or grouped_tile_for(m, weight.n), _lead(m, lead))
    tail = (weight.q, weight.scales, weight.group_offsets)
    return _framed(frame, tail if bias is None else tail + (_as_f32(bias),))


@functools.lru_cache(maxsize=_FRAMES)
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


# The group-wise Hopper GEMM (gemm_grouped_ws.cu) ----------------------------------------
# The per-channel TMA GEMM's mainloop (TMA producer, two consumer warpgroups on wgmma, a
# persistent grid) with each weight group's int32 sum promoted into float32 accumulators.
# Compiled for sm_90a in CI; not yet run on a GPU, and not in any tuning table or prior:
# the tuner races it where it is offered (cuda.py: Hopper, tensor maps).
class GroupedTmaConfig(NamedTuple):
    """Tile of the group-wise TMA GEMM (``gemm_grouped_ws.cu``): 128 x ``bn`` (``bn``
    128, 64 or 32: a consumer thread holds an int32 and a float32 accumulator set of
    ``bn / 2`` values each), a ``stages``-deep ring whose stages hold A's and B's
    tiles for 128 bytes of K and the tile's ``(scale, offset)`` pairs of the groups in
    them, 8 consumer warps and ``producers`` producer warps (4: the producer warpgroup
    hands its registers to the consumers, needed at ``bn = 128``; or 1); at most one
    block per SM."""

    bn: int
    stages: int
    producers: int

    file = "gemm_grouped_ws.cu"
    bm = 128

    @property
    def threads(self) -> int:
        return 256 + 32 * self.producers

    def shared_memory(self, group_size: int) -> int:
        """Dynamic shared memory for ``group_size``: the ring (A and B tiles plus
        ``128 / group_size`` groups' float32 pairs for ``bn`` columns per stage), 8
        per-warp epilogue staging buffers (2560 bytes), the full/empty mbarriers, room to
        stage 1 + MAX_SIBLINGS tensor maps with 128 bytes to align them, and 1024 bytes
        to round the ring's base up to the 128-byte swizzle's 1024-byte atom."""
        terms = (128 // group_size) * self.bn * 8
        maps = (1 + MAX_SIBLINGS + 1) * tensormap.MAP_BYTES
        return (self.stages * ((self.bm + self.bn) * 128 + terms) + 8 * 2560
                + 16 * self.stages + maps + 1024)

    def template(self) -> list[tuple[str, int]]:
        return [("BN", self.bn), ("STAGES", self.stages), ("PW", self.producers)]


# As many ring stages as fit an H200's 227 KiB at group size 32 (the largest stages).
GROUPED_TMA_CONFIGS = {
    "gtma128": GroupedTmaConfig(128, 5, 4),
    "gtma64": GroupedTmaConfig(64, 7, 1),
    "gtma32": GroupedTmaConfig(32, 9, 1),
}
# Every k-tile of 128 bytes of K holds whole groups (gemm_grouped_ws.cu "Tile K").
GROUPED_TMA_K_MULTIPLE = 128
GROUPED_TMA_GROUP_SIZES = (32, 64, 128)
# The group sums' array ends with room for A's tensor map (128 bytes + up to 127 to align).
GROUPED_SUMS_MAP_AREA = 256


def grouped_tma_tile_for(m: int, n: int) -> GroupedTmaConfig:
    """The group-wise TMA GEMM's tile for an ``M x N`` output (:func:`tiles_filling`
    over ``GROUPED_TMA_CONFIGS``)."""
    return tiles_filling(m, n, GROUPED_TMA_CONFIGS.values())


def grouped_sums_shape(m: int, k: int, group_size: int) -> tuple[int]:
    """The group-wise TMA GEMM's row-sums array for ``m`` rows of ``k`` codes: ``[m * (k /
    group_size) + 64]`` int32, the per-group code sums ``R_mg`` (row-major ``[m, G]``)
    followed by 256 bytes where the GEMM writes its tensor map of the codes."""
    return (m * (k // group_size) + GROUPED_SUMS_MAP_AREA // 4,)


def grouped_terms(weight, bn: int) -> mx.array:
    """The group-wise TMA GEMM's per-group terms of ``weight`` on tiles ``bn`` wide:
    float32 ``[ceil(N / bn), G, bn, 2]`` (flat), element ``[t, g, c]`` the pair
    ``(s, o)`` of row ``n = t bn + c`` and group ``g`` (``s`` the stored scale in float32,
    ``o = b + 128 s``: :attr:`QuantizedWeight.group_offsets`), zeros for ``n >= N``. One
    k-tile's groups for one tile column are then contiguous: the kernel copies them into
    shared memory with one bulk copy per stage. Made once per weight and tile width and
    kept with the weight (:meth:`QuantizedWeight.derived`), in MLX ops like
    :attr:`QuantizedWeight.group_offsets` (lazy: nothing is read on the host, also under
    ``mx.compile``; :meth:`LaunchSpec.bound` evaluates it where it can)."""
    def make():
        t = mx.stack([weight.scales.astype(mx.float32), weight.group_offsets], axis=-1)
        n, g = weight.n, weight.k // weight.group_size
        tiles_n = -(-n // bn)
        if tiles_n * bn > n:
            t = mx.concatenate([t, mx.zeros((tiles_n * bn - n, g, 2), dtype=mx.float32)])
        return t.reshape(tiles_n, bn, g, 2).transpose(0, 2, 1, 3).reshape(-1)
    return weight.derived(("cuda_grouped_terms", bn), make)


def quantize_groups_spec(m: int, k: int, dtype: mx.Dtype, group_size: int,
                         lead: tuple[int, ...] | None = None) -> LaunchSpec:
    """The launch of :func:`quantize_groups`: the ``sums`` quantize of :func:`quantize`
    (the same kernel, the same bits) with its row sums in a :func:`grouped_sums_shape`
    array."""
    if group_size not in GROUPED_TMA_GROUP_SIZES or k % group_size:
        raise ValueError(f"[mlx_w8a8.cuda_quantize] group_size must be one of "
                         f"{GROUPED_TMA_GROUP_SIZES} and divide K = {k}, got {group_size}")
    spec = quantize_spec(m, k, dtype, group_size, lead=lead)
    shapes = list(spec.output_shapes)
    shapes[2] = grouped_sums_shape(m, k, group_size)
    return spec._replace(output_shapes=shapes)


def quantize_groups(x: mx.array, group_size: int):
    """Per-token int8 quantization for the group-wise TMA GEMM.

    Args:
        x: ``[..., K]`` float16/bfloat16/float32, ``K`` a multiple of ``group_size``.
        group_size: 32, 64 or 128.

    Returns:
        ``(q, scale, xr)``: ``[..., K]`` int8, ``[..., 1]`` float32 and the group sums
        ``[M * K / group_size + 64]`` int32 (:func:`grouped_sums_shape`; its first
        ``M * K / group_size`` values are :func:`quantize`'s row sums, row-major).
    """
    k = x.shape[-1]
    m = x.size // k
    return tuple(quantize_groups_spec(m, k, x.dtype, group_size, tuple(x.shape[:-1])).launch(x))


def gemm_grouped_tma_spec(m: int, k: int, weight, bias, out_dtype: mx.Dtype,
                          config: GroupedTmaConfig | None = None,
                          lead: tuple[int, ...] | None = None) -> LaunchSpec:
    """The launch of :func:`gemm_grouped_tma` (activations ``xq, xs, xr``); outputs
    ``[*lead, N]`` with ``lead``, as :func:`quantize_spec`.

    Raises:
        ValueError: for M < 1, a per-channel weight, a group size other than 32, 64 or
            128, K not a multiple of 128 (or not the weight's, or not below 2^17), or a
            tile not of ``GROUPED_TMA_CONFIGS``' kind.
    """
    cfg = _grouped_tma_checked(m, k, weight, config or grouped_tma_tile_for(m, weight.n))
    frame = _gemm_grouped_tma_frame(m, k, weight.n, bias is not None, weight.group_size,
                                    out_dtype, cfg, _lead(m, lead))
    tail = (weight.q, grouped_terms(weight, cfg.bn))
    if bias is not None:
        tail += (_as_f32(bias),)
    return _framed(frame, tail + (weight_maps(weight, cfg.bn),))


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
    if not isinstance(cfg, GroupedTmaConfig):
        raise ValueError(f"{op} the tile must be a GroupedTmaConfig (GROUPED_TMA_CONFIGS), "
                         f"got {cfg}")
    return cfg


@functools.lru_cache(maxsize=_FRAMES)
def _gemm_grouped_tma_frame(m: int, k: int, n: int, has_bias: bool, group_size: int,
                            out_dtype: mx.Dtype, cfg: GroupedTmaConfig,
                            lead: tuple[int, ...]) -> LaunchSpec:
    """:func:`gemm_grouped_tma_spec` for any weight of this shape and group size on tile
    ``cfg`` (no tail: its inputs are the weight's codes, :func:`grouped_terms`, the
    float32 bias and :func:`weight_maps`)."""
    names = ("xq", "xs", "xr", "w", "wt")
    body = "tma_grouped"
    if has_bias:
        names += ("bias",)
        body += "_bias"
    names += ("wmap",)  # A's map goes into xr's map area, the weight's into wmap
    blocks = min(tiles(m, n, cfg), SMS)
    kern = (cfg.file, body, names, ("y",), cfg.shared_memory(group_size))
    template = [("T", out_dtype), ("GS", group_size)] + cfg.template()
    return LaunchSpec(kern, (), template, [(*lead, n)], [out_dtype],
                      (blocks * cfg.threads, 1, 1), (cfg.threads, 1, 1))


def gemm_grouped_tma(xq, xs, xr, weight, bias, out_dtype,
                     config: GroupedTmaConfig | None = None) -> mx.array:
    """Group-wise W8A8 GEMM on Hopper (``gemm_grouped_ws.cu``).

    Args:
        xq: ``[..., K]`` int8 codes, ``xs`` ``[..., 1]`` float32 scales and ``xr`` the
            group sums in a :func:`grouped_sums_shape` array: :func:`quantize_groups`.
        weight: a grouped ``QuantizedWeight`` ``[N, K]`` (group size 32, 64 or 128,
            ``K % 128 == 0``).
        bias: ``[N]`` or ``None``.
        out_dtype: the output's dtype.
        config: the tile; ``None``: :func:`grouped_tma_tile_for`.

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
    want = grouped_sums_shape(m, k, weight.group_size)
    if xr.dtype != mx.int32 or tuple(xr.shape) != want:
        raise ValueError(f"[mlx_w8a8.cuda_w8a8_gemm_grouped_tma] the group sums must be an "
                         f"int32 array of shape {want} (quantize_groups), got {xr.dtype} "
                         f"{tuple(xr.shape)}")
    return gemm_grouped_tma_spec(m, k, weight, bias, out_dtype, config,
                                 tuple(xq.shape[:-1])).launch(xq, xs, xr)[0]


def gemm_grouped_tma_group_spec(m: int, k: int, members, out_dtype: mx.Dtype,
                                config: GroupedTmaConfig | None = None,
                                lead: tuple[int, ...] | None = None) -> LaunchSpec:
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
    if not 2 <= len(members) <= MAX_SIBLINGS:
        raise ValueError(f"{op} a sibling launch takes 2 to {MAX_SIBLINGS} weights, "
                         f"got {len(members)}")
    has_bias = {b is not None for _, b in members}
    if len(has_bias) != 1:
        raise ValueError(f"{op} sibling weights must all have a bias or none, got "
                         f"{[b is not None for _, b in members]}")
    first = members[0][0]
    for w, _ in members:
        if w.per_channel or w.k != k or w.group_size != first.group_size:
            raise ValueError(f"{op} sibling weights must be grouped with K = {k} and one "
                             f"group size, got per_channel={w.per_channel}, K={w.k}, "
                             f"group_size={w.group_size} (first: {first.group_size})")
    ns = tuple(w.n for w, _ in members)
    cfg = config or grouped_tma_tile_for(m, sum(ns))
    for w, _ in members:  # each member alone must be a valid launch (K, group size, tile)
        _grouped_tma_checked(m, k, w, cfg)
    frame = _gemm_grouped_tma_group_frame(m, k, ns, True in has_bias, first.group_size,
                                          out_dtype, cfg, _lead(m, lead))
    tail = []
    for w, b in members:
        tail += [w.q, grouped_terms(w, cfg.bn)] + ([] if b is None else [_as_f32(b)])
    tail += [weight_maps(w, cfg.bn) for w, _ in members]
    return _framed(frame, tuple(tail))


@functools.lru_cache(maxsize=_FRAMES)
def _gemm_grouped_tma_group_frame(m: int, k: int, ns: tuple[int, ...], has_bias: bool,
                                  group_size: int, out_dtype: mx.Dtype, cfg: GroupedTmaConfig,
                                  lead: tuple[int, ...]) -> LaunchSpec:
    """:func:`gemm_grouped_tma_group_spec` for any members of ``ns`` rows (no tail: the
    members' codes, terms and float32 biases, then their map arrays)."""
    names = ["xq", "xs", "xr"]
    for g in range(len(ns)):
        names += [f"w{g}", f"wt{g}"] + ([f"bias{g}"] if has_bias else [])
    names += [f"wmap{g}" for g in range(len(ns))]
    body = f"tma_grouped_group{len(ns)}" + ("_bias" if has_bias else "")
    outs = tuple(f"y{g}" for g in range(len(ns)))
    blocks = min(-(-m // cfg.bm) * sum(-(-n // cfg.bn) for n in ns), SMS)
    kern = (cfg.file, body, tuple(names), outs, cfg.shared_memory(group_size))
    template = [("T", out_dtype), ("GS", group_size)] + cfg.template()
    return LaunchSpec(kern, (), template, [(*lead, n) for n in ns], [out_dtype] * len(ns),
                      (blocks * cfg.threads, 1, 1), (cfg.threads, 1, 1))


def bind_quantize_groups(m: int, k: int, dtype: mx.Dtype, group_size: int,
                         lead: tuple[int, ...] | None = None):
    """``f(x) -> (q, scale, xr)``: :func:`quantize_groups` for ``[M, K]`` (or
    ``[*lead, K]``) ``dtype`` ``x``."""
    run = quantize_groups_spec(m, k, dtype, group_size, lead).bound()
    return lambda x: tuple(run(x))


def bind_gemm_grouped_tma(m: int, k: int, weight, bias, out_dtype: mx.Dtype,
                          config: GroupedTmaConfig | None = None,
                          lead: tuple[int, ...] | None = None):
    """``f(acts) -> y``: :func:`gemm_grouped_tma` on ``acts = (xq, xs, xr)`` from
    :func:`bind_quantize_groups`."""
    return _bind_acts3(gemm_grouped_tma_spec(m, k, weight, bias, out_dtype, config, lead))


def bind_gemm_grouped_tma_group(m: int, k: int, members, out_dtype: mx.Dtype,
                                config: GroupedTmaConfig | None = None,
                                lead: tuple[int, ...] | None = None):
    """``f(acts) -> [y_0, y_1, ...]``: :func:`gemm_grouped_tma_group_spec`'s launch on
    ``acts = (xq, xs, xr)`` (:func:`bind_quantize_groups`), one output per member."""
    run = gemm_grouped_tma_group_spec(m, k, members, out_dtype, config, lead).bound()
    return lambda acts: run(*acts)


def gemv_fuses(m: int, k: int) -> bool:
    """Whether the one-launch GEMV (x quantized into shared memory) takes ``M x K``."""
    return gemv_bucket(m) * k <= GEMV_FUSED_MAX_SMEM


def _gemv_weight(weight, bias, dtype):
    """Weight inputs, their names, the dtype/group template and the body name."""
    if not weight.per_channel:
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
        w_inputs.append(_as_f32(bias))
        w_names += ("bias",)
        body += "_bias"
    return w_inputs, w_names, template, body


def gemv_fused_spec(m: int, k: int, weight, bias, dtype: mx.Dtype,
                    lead: tuple[int, ...] | None = None) -> LaunchSpec:
    """The one-launch GEMV (activation ``x`` ``[M, K]`` of ``dtype``, ``M <= 16``)."""
    n = weight.n
    lead = _lead(m, lead)
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
    if not 2 <= len(members) <= MAX_SIBLINGS:
        raise ValueError(f"{op} a sibling launch takes 2 to {MAX_SIBLINGS} weights, "
                         f"got {len(members)}")
    if len({b is not None for _, b in members}) != 1:
        raise ValueError(f"{op} sibling weights must all have a bias or none, got "
                         f"{[b is not None for _, b in members]}")
    first = members[0][0]
    for w, _ in members:
        if (w.k != k or w.format != first.format or w.group_size != first.group_size
                or w.scales.dtype != first.scales.dtype):  # grouped: one ST for every ws<g>
            raise ValueError(f"{op} sibling weights must share K = {k}, the format, the "
                             f"group size and the scales' dtype, got K={w.k}, "
                             f"format={w.format}, group_size={w.group_size}, "
                             f"scales {w.scales.dtype} (first: {first.format}, "
                             f"group_size={first.group_size}, scales {first.scales.dtype})")
    if not gemv_fuses(m, k):
        raise ValueError(f"{op} the sibling launch is the fused kernel: needs "
                         f"bucket(M) * K <= {GEMV_FUSED_MAX_SMEM}, got M={m}, K={k}")
    lead = _lead(m, lead)
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
    lead = _lead(m, lead)
    mm = gemv_bucket(m)
    rw = gemv_rows_per_warp(mm)
    w_inputs, w_names, template, body = _gemv_weight(weight, bias, out_dtype)
    kern = _kernel("gemv.cu", body, ("xq", "xs") + w_names, ("y",))
    return LaunchSpec(kern, tuple(w_inputs), template + [("MM", mm), ("RW", rw)],
                      [(*lead, n)], [out_dtype], (-(-n // rw) * 32, 1, 1), (GEMV_THREADS, 1, 1))


# Launchers: build the spec and launch it (every call) -----------------------------------
def quantize(x: mx.array, group_size: int | None = None, row_sum: bool = False,
             warp: bool = False):
    """Per-token int8 quantization on the GPU.

    Args:
        x: ``[M, K]`` float16/bfloat16/float32, ``K % 8 == 0``.
        group_size: ``None`` or 32/64/128 dividing K (adds per-group row sums).
        row_sum: with ``group_size=None``, also return each row's code sum ``[M, 1]``
            int32 (the per-channel GEMM's correction term): :func:`quantize_rowsum`'s
            array, unpacked (:func:`unpack_rowsum`).
        warp: with ``row_sum``, the one-warp-per-row kernel (``rowsum_warp``: 8 rows
            per block, no block barrier) instead of one block per row; same bits.

    Returns:
        ``(q, scale, row_sums)``: ``[M, K]`` int8, ``[M, 1]`` float32 and
        ``[M, K // group_size]`` int32, ``[M, 1]`` int32 (``row_sum``) or ``None``.
    """
    m, k = x.shape
    if row_sum and group_size is None:
        return unpack_rowsum(quantize_rowsum(x, warp))
    out = quantize_spec(m, k, x.dtype, group_size, row_sum, warp).launch(x)
    return (out[0], out[1], out[2] if len(out) == 3 else None)


def quantize_rowsum(x: mx.array, warp: bool = False) -> mx.array:
    """The per-channel GEMM's activations of ``x`` in one launch and one array.

    Args:
        x: ``[..., K]`` float16/bfloat16/float32, ``K % 8 == 0``.
        warp: the one-warp-per-row kernel (``rowsum_warp``); same bits.

    Returns:
        ``[R, K]`` int8 (:func:`rowsum_shape`, ``M`` the rows of ``x``): the codes, then
        the float32 scales and the int32 row sums (:func:`unpack_rowsum` splits it),
        then the map area, zero, for :func:`gemm_rowsum`.
    """
    k = x.shape[-1]
    return quantize_spec(x.size // k, k, x.dtype, None, True, warp).launch(x)[0]


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
    grid = _grid(m, n, cfg)
    ws = isinstance(cfg, WsConfig)
    inputs, names, shapes, dtypes, outs = [a, b], ("a", "b"), [(m, n)], [mx.int32], ("c",)
    if ws and cfg.tma:  # + the tensor-map prototypes and the maps' scratch output
        proto, scratch = _tma_io(cfg, k, (n,), grid)
        inputs, names, outs = inputs + [proto], names + ("proto",), outs + ("tmap",)
        shapes, dtypes = shapes + [scratch], dtypes + [mx.uint8]
    kern = _kernel(cfg.file, cfg.body("int32") if ws else "int32", names, outs,
                   cfg.shared_memory)
    return kern(
        inputs=inputs, template=cfg.template(), output_shapes=shapes, output_dtypes=dtypes,
        grid=(grid * cfg.threads, 1, 1), threadgroup=(cfg.threads, 1, 1),
    )[0]


def int8_gemm_ws(a: mx.array, b: mx.array, config: WsConfig | None = None) -> mx.array:
    """:func:`int8_gemm` on the warp-specialized kernel (``config`` or :func:`ws_tile_for`)."""
    return int8_gemm(a, b, config or ws_tile_for(a.shape[0], b.shape[0]))


def int8_gemm_tma(a: mx.array, b: mx.array, config: WsConfig | None = None) -> mx.array:
    """:func:`int8_gemm` on the warp-specialized kernel with the TMA producer (``config``
    or :func:`tma_tile_for`)."""
    return int8_gemm(a, b, config or tma_tile_for(a.shape[0], b.shape[0], a.shape[1]))


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


def gemm_grouped(xq, xs, xr, weight, bias, out_dtype, config: GemmConfig | None = None):
    """Grouped W8A8 GEMM (``xr`` the ``[M, K // group_size]`` int32 row sums)."""
    return gemm_grouped_spec(xq.shape[0], weight, bias, out_dtype, config).launch(xq, xs, xr)[0]


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


# Bound launchers: the spec built once, each call only launches --------------------------
# A layer's shapes, dtype and weight are fixed between its decisions, so everything but
# the activations is computed here once (kernel object, weight inputs with the float32
# bias, template, output shapes, grid, threadgroup, tile); the closures make the launch
# the launcher above would make for the same arguments, and nothing else.
def bind_quantize(m: int, k: int, dtype: mx.Dtype, group_size: int | None = None,
                  row_sum: bool = False, lead: tuple[int, ...] | None = None):
    """``f(x) -> (q, scale, row_sums)``: :func:`quantize` for ``[M, K]`` (or
    ``[*lead, K]``) ``dtype`` ``x``; ``f(x) -> (xa,)``, :func:`quantize_rowsum`'s one
    array, with ``row_sum``."""
    spec = quantize_spec(m, k, dtype, group_size, row_sum, lead=lead)
    run = spec.bound()
    if len(spec.output_shapes) == 2:
        def run_plain(x):
            q, scale = run(x)
            return q, scale, None
        return run_plain
    return lambda x: tuple(run(x))


def _bind_acts1(spec: LaunchSpec):
    """``f(acts) -> y`` launching ``spec`` on ``acts[0]`` (the activation array)."""
    run = spec.bound(slice(1))
    return lambda acts: run(acts[0])[0]


def _bind_acts2(spec: LaunchSpec):
    """``f(acts) -> y`` launching ``spec`` on ``acts[0], acts[1]`` (codes, scales)."""
    run = spec.bound(slice(1))
    return lambda acts: run(acts[0], acts[1])[0]


def _bind_acts3(spec: LaunchSpec):
    """``f(acts) -> y`` launching ``spec`` on ``acts`` (codes, scales, row sums)."""
    run = spec.bound(slice(1))
    return lambda acts: run(*acts)[0]


def bind_gemm_per_channel(m: int, k: int, weight, bias, out_dtype: mx.Dtype,
                          config: GemmConfig | WsConfig | None = None, unsigned: bool = False,
                          lead: tuple[int, ...] | None = None):
    """``f(acts) -> y``: :func:`gemm_rowsum` on ``acts = (xa,)`` from
    ``bind_quantize(row_sum=True)`` when ``unsigned``, else :func:`gemm_per_channel` on
    ``acts = (xq, xs, _)``."""
    spec = gemm_per_channel_spec(m, k, weight, bias, out_dtype, config, unsigned, lead)
    return _bind_acts1(spec) if unsigned else _bind_acts2(spec)


def bind_gemm_ws_group(m: int, k: int, members, out_dtype: mx.Dtype,
                       config: WsConfig | None = None, lead: tuple[int, ...] | None = None):
    """``f(acts) -> [y_0, y_1, ...]``: :func:`gemm_ws_group_spec`'s launch on
    ``acts = (xa,)`` (``bind_quantize(row_sum=True)``), one output per member."""
    run = gemm_ws_group_spec(m, k, members, out_dtype, config, lead).bound()
    return lambda acts: run(*acts)


def bind_gemm_grouped(m: int, weight, bias, out_dtype: mx.Dtype, config: GemmConfig | None = None,
                      lead: tuple[int, ...] | None = None):
    """``f(acts) -> y``: :func:`gemm_grouped` on ``acts = (xq, xs, xr)``."""
    return _bind_acts3(gemm_grouped_spec(m, weight, bias, out_dtype, config, lead))


def bind_gemv_fused(m: int, k: int, weight, bias, dtype: mx.Dtype,
                    lead: tuple[int, ...] | None = None):
    """``f(x) -> y``: the one-launch :func:`gemv` for ``[M, K]`` ``dtype`` ``x``."""
    run = gemv_fused_spec(m, k, weight, bias, dtype, lead).bound(slice(1))
    return lambda x: run(x)[0]


def bind_gemv_fused_group(m: int, k: int, members, dtype: mx.Dtype,
                          lead: tuple[int, ...] | None = None):
    """``f(x) -> [y_0, y_1, ...]``: :func:`gemv_fused_group_spec`'s launch on ``x``."""
    return gemv_fused_group_spec(m, k, members, dtype, lead).bound()


def bind_gemv_quantized(m: int, weight, bias, out_dtype: mx.Dtype,
                        lead: tuple[int, ...] | None = None):
    """``f(acts) -> y``: :func:`gemv_quantized` on ``acts = (xq, xs, _)``."""
    return _bind_acts2(gemv_quantized_spec(m, weight, bias, out_dtype, lead))
