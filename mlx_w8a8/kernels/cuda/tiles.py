"""Tile shapes of the CUDA GEMMs and the policies that pick one for an ``M x N`` output.

Configurations: :class:`GemmConfig` (``mma.sync``, ``gemm.cu``; the Hopper ``wgmma``
tile, ``gemm_wgmma.cu``), :class:`WsConfig` (the warp-specialized persistent GEMM,
``gemm_ws.cu``, cp.async or TMA producer) and :class:`GroupedTmaConfig` (the group-wise
TMA GEMM, ``gemm_grouped_ws.cu``). A kernel definition calls its policy once per problem
(``tile``) and passes the tile to its launches.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from .. import tensormap
from . import launch
from .launch import MAX_SIBLINGS, SMS


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
        return GEMM_CONFIGS["wgmma"] if PREFER_WGMMA and launch.is_sm90() else large
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


def grid_blocks(m: int, n: int, cfg: GemmConfig | WsConfig) -> int:
    """Blocks to launch: one per tile, or (persistent kernel) at most one per SM."""
    count = tiles(m, n, cfg)
    return min(count, SMS) if isinstance(cfg, WsConfig) else count


# The group-wise Hopper GEMM (gemm_grouped_ws.cu) ----------------------------------------
# The per-channel TMA GEMM's mainloop (TMA producer, two consumer warpgroups on wgmma, a
# persistent grid) with each weight group's int32 sum promoted into float32 accumulators.
# Exact on an H200 (tests/test_cuda.py); measured and chosen from M = 128 on Llama-3-8B's
# shapes (the shipped table, the CUDA prior; docs/cuda.md).
class GroupedTmaConfig(NamedTuple):
    """Tile of the group-wise TMA GEMM (``gemm_grouped_ws.cu``): 128 x ``bn`` (``bn``
    128, 64 or 32: a consumer thread holds an int32 and a float32 accumulator set of
    ``bn / 2`` values each), a ``stages``-deep ring whose stages hold A's and B's
    tiles for 128 bytes of K and the tile's ``(scale, offset)`` pairs of the groups in
    them, 8 consumer warps and ``producers`` producer warps (4: the producer warpgroup
    hands its registers to the consumers, needed at ``bn = 128``; or 1); at most one
    block per SM. ``bits`` 4: the 4-bit weights' form (bodies ``tma_groupwise*`` with ``WB`` 4), whose
    stages also hold the tile's packed rows (``bn * 64`` bytes) and a third mbarrier,
    and whose four producer warps expand the codes (``producers`` must be 4). ``order``:
    the consumer warpgroups take turns issuing their MMAs, each promoting under the
    other's (``gemm_grouped_ws.cu``, MMA order; the same outputs bit for bit). ``live``:
    a consumer warp whose 16 rows of a tile all lie past M skips its promotions and its
    epilogue (``gemm_grouped_ws.cu``, rows past M; the same stored outputs bit for bit):
    at M <= 64 half the consumer warps or more. :func:`grouped_tma_tile_for` turns it
    on at M = 17-112 (``LIVE_M``). ``pipe`` (2 or 4; 0 off): a consumer warpgroup
    promotes each group under its next group's MMAs, in runs of ``pipe`` groups (two
    int32 sets; ``gemm_grouped_ws.cu``, pipelined promotion; the same outputs bit for
    bit): ``pipe`` must divide ``K / group_size``, 4 only where ``bn <= 64``
    (``PIPE_RUNS``), never with ``order``. :func:`grouped_tma_tile_for` turns it on at
    ``PIPE_M`` (nowhere yet). ``sub``: the subnormal promotion (``gemm_grouped_ws.cu``,
    bodies ``tma_subnormal*``; ``SUB_TMA_CONFIGS``): unsigned activation codes, one FMA
    per accumulator and group, the offset term on bfloat16 wgmmas; a stage holds the
    k-tile's ``S`` (bfloat16: 2 bytes per column and group) and one offset block's
    pieces (32 bytes per column), never with ``order``, ``live`` or ``pipe``."""

    bn: int
    stages: int
    producers: int
    bits: int = 8
    order: bool = False
    live: bool = False
    pipe: int = 0
    sub: bool = False

    bm = 128

    @property
    def file(self) -> str:
        """The kernel file of its bodies (the subnormal promotion's are their own file)."""
        return "gemm_subnormal.cu" if self.sub else "gemm_grouped_ws.cu"

    @property
    def threads(self) -> int:
        return 256 + 32 * self.producers

    def shared_memory(self, group_size: int) -> int:
        """Dynamic shared memory for ``group_size``: the ring (A and B tiles plus
        ``128 / group_size`` groups' float32 pairs for ``bn`` columns per stage; the
        subnormal promotion's: their bfloat16 ``S`` and an offset block's pieces), 8
        per-warp epilogue staging buffers (2560 bytes), the full/empty mbarriers, room to
        stage 1 + MAX_SIBLINGS tensor maps with 128 bytes to align them, and 1024 bytes
        to round the ring's base up to the 128-byte swizzle's 1024-byte atom."""
        groups = 128 // group_size
        terms = groups * self.bn * 2 + self.bn * 32 if self.sub else groups * self.bn * 8
        maps = (1 + MAX_SIBLINGS + 1) * tensormap.MAP_BYTES
        four = self.bits == 4  # + the packed rows and the packed[s] mbarrier per stage
        packed, barriers = (self.bn * 64, 24) if four else (0, 16)
        return (self.stages * ((self.bm + self.bn) * 128 + terms + packed) + 8 * 2560
                + barriers * self.stages + maps + 1024)

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

# The 4-bit form: as many stages as fit 227 KiB at group size 32 with the packed rows;
# always the producer warpgroup (its four warps expand the codes).
GROUPED4_TMA_CONFIGS = {
    "g4tma128": GroupedTmaConfig(128, 4, 4, 4),
    "g4tma64": GroupedTmaConfig(64, 6, 4, 4),
    "g4tma32": GroupedTmaConfig(32, 8, 4, 4),
}


# The subnormal promotion (bodies tma_subnormal*): 8-bit codes on 128- and 64-wide tiles,
# 4-bit ones on the 128-wide tile (its producer warpgroup expands them); as many stages as
# fit 227 KiB at group size 32.
SUB_TMA_CONFIGS = {
    "gsub128": GroupedTmaConfig(128, 5, 4, sub=True),
    "gsub64": GroupedTmaConfig(64, 7, 1, sub=True),
    "g4sub128": GroupedTmaConfig(128, 4, 4, 4, sub=True),
}


def sub_groups(group_size: int) -> int:
    """Groups per offset block of the subnormal promotion (template argument ``GB``): the
    block's ``2 GB`` piece columns and 3 constant columns fit one k16 step, and a block is
    whole k-tiles (``GB`` a multiple of ``128 / group_size``). The consumers unroll a
    block's groups (``gemm_subnormal.cu``): at group size 128 six groups of four k32
    wgmmas spilled registers in the block loop, four do not."""
    return {32: 4, 64: 6}.get(group_size, 4)


def sub_tile_for(m: int, n: int, bits: int = 8) -> GroupedTmaConfig:
    """The subnormal promotion's tile for an ``M x N`` output: the 4-bit tile, or for
    8-bit codes :func:`tiles_filling` over the 8-bit ones."""
    if bits == 4:
        return SUB_TMA_CONFIGS["g4sub128"]
    return tiles_filling(m, n, [c for c in SUB_TMA_CONFIGS.values() if c.bits == 8])


# The group-wise TMA GEMM's pipelined promotion: the run lengths the kernel takes, by
# tile width (three int32 / float32 sets of 64 registers at bn = 128 leave no room for
# runs of 4: ptxas spills them).
PIPE_RUNS = {128: (2,), 64: (2, 4), 32: (2, 4)}


def pipe_runs(cfg: GroupedTmaConfig, k: int, group_size: int) -> list[int]:
    """The pipelined-promotion runs (``GroupedTmaConfig.pipe``) tile ``cfg`` can take at
    ``K`` and ``group_size``: those of ``PIPE_RUNS[cfg.bn]`` dividing ``K / group_size``."""
    return [r for r in PIPE_RUNS.get(cfg.bn, ()) if (k // group_size) % r == 0]


def pipe_run(cfg: GroupedTmaConfig, k: int, group_size: int) -> int:
    """The longest pipelined-promotion run (``GroupedTmaConfig.pipe``) tile ``cfg`` can
    take at ``K`` and ``group_size``: one of ``PIPE_RUNS[cfg.bn]`` dividing
    ``K / group_size``, or 0 where none does."""
    return max(pipe_runs(cfg, k, group_size), default=0)


# Where grouped_tma_tile_for turns the rows-past-M skip on (its docstring says why).
LIVE_M = range(17, GroupedTmaConfig.bm - 16 + 1)

# Where grouped_tma_tile_for turns the pipelined promotion on, with the tile's longest
# run (pipe_run): nowhere. Exact on an H100 (tests/test_cuda.py -k pipelined); timed there
# (docs/cuda.md) at 0.97-1.00x the plain tile at prefill (8-bit, group size 64), slower at
# 4 bits and group size 32, 0.90-1.02x with the skip at M = 64: too little for a rule.
PIPE_M = range(0)


def grouped_tma_tile_for(m: int, n: int, bits: int = 8, k: int | None = None,
                         group_size: int | None = None) -> GroupedTmaConfig:
    """The group-wise TMA GEMM's tile for an ``M x N`` output (:func:`tiles_filling`
    over ``GROUPED_TMA_CONFIGS``, or ``GROUPED4_TMA_CONFIGS`` for 4-bit weights), with
    the rows-past-M skip (``live``) at ``LIVE_M``: where M leaves at least one consumer
    warp of its one row tile without a row (M <= 112), from the M bucket 32 on.

    Measured on an NVIDIA H200 (8-bit codes, group size 64, Llama-3-8B's 4096 x 14336,
    14336 x 4096 and 4096 x 4096; part LIVE of bench/results/h100_2026-12-05_f.log): at
    M = 16 and 64 the skip took 0.77-0.98x the plain tile's kernel time on all 18 tile
    and shape pairs, at M = 1 (the same idle warps as M = 16) 0.78-1.08x (faster on 7 of
    9); at M = 128, where no warp is idle, 0.99-1.07x (the plain 8-bit tile runs the
    ``tma_grouped`` body). M > 128 keeps the plain tile: only the last row tile could
    skip, and that was not measured. M <= 16 keeps it too, though the skip was faster
    there: the shipped H200 table's M = 16 bucket measured the plain tile (its entries
    stay valid only while that bucket launches what they timed), and no prior rule
    picks this GEMM below M = 17.

    With ``k`` and ``group_size`` given, the pipelined promotion (``pipe``) at
    ``PIPE_M``, the tile's longest run (:func:`pipe_run`; none where no run divides
    ``K / group_size``)."""
    cfg = tiles_filling(m, n, (GROUPED4_TMA_CONFIGS if bits == 4 else GROUPED_TMA_CONFIGS).values())
    cfg = cfg._replace(live=m in LIVE_M)
    if k is not None and group_size is not None and m in PIPE_M:
        cfg = cfg._replace(pipe=pipe_run(cfg, k, group_size))
    return cfg



# The dequantizing GEMM (gemm_dequant.cu) -------------------------------------------------
class DequantConfig(NamedTuple):
    """Tile of the dequantizing GEMM (``gemm_dequant.cu``): 128 weight rows (output
    features, two m64 consumer warpgroups) x ``bn`` tokens (64, 128 or 256: the wgmma's
    n), a ``stages``-deep ring filled by TMA loads."""

    bn: int
    stages: int

    file = "gemm_dequant.cu"
    bm = 128  # weight rows per tile
    threads = 384

    def stage_bytes(self, bits: int) -> int:
        """One stage: ``bn`` activation rows of 128 bytes (64 16-bit values of K) and 128
        weight rows of 64 8-bit or 4-bit codes."""
        return self.bn * 128 + self.bm * 64 * bits // 8

    def shared_memory(self, bits: int) -> int:
        # Ring + 8 per-warp epilogue staging buffers (1 KiB) + full/empty mbarriers + the
        # two maps' staging (128-byte aligned) + 1024 bytes to round the ring's base up
        # to the swizzle's 1024-byte atom.
        return (self.stages * self.stage_bytes(bits) + 8 * 1024 + 16 * self.stages
                + 128 + 2 * 128 + 1024)

    def template(self) -> list[tuple[str, int]]:
        return [("BN", self.bn), ("STAGES", self.stages)]


# 8 stages of 24 KiB (128 tokens, 8-bit codes) fit an H100's or H200's 227 KiB beside the
# staging, 5 of 40 KiB (256 tokens); a consumer thread holds bn / 2 float32 sums and two
# fragment sets (the producers give it their registers: up to 232).
DEQUANT_CONFIGS = {
    "dq256": DequantConfig(256, 5),
    "dq128": DequantConfig(128, 8),
    "dq64": DequantConfig(64, 8),
}

# K per stage: whole k-tiles only.
DEQUANT_K_MULTIPLE = 64


def dequant_tile_for(m: int, n: int) -> DequantConfig:
    """The token tile for ``M`` rows and ``N`` features: among the tiles no wider than M
    (64 tokens always), the widest whose 128-feature x ``bn``-token tiles fill the SMs
    (:func:`tiles_filling`), else the narrowest. A tile wider than M multiplies rows
    that are not there: its MMAs cost the same whatever M is. Measured on an NVIDIA H100
    (docs/cuda.md, the dequantizing GEMM): at M = 512 the 256-token tile took 126 us on
    4096 x 14336 (K x N, 224 tiles) against 165 for 128 tokens, and 177 us on
    14336 x 4096 (64 tiles) against 138."""
    fit = [c for c in DEQUANT_CONFIGS.values() if c.bn <= max(m, 64)]
    return tiles_filling(n, m, fit)
