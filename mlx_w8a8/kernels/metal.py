"""Metal candidates: kernels in ``shaders/metal/*.metal`` run through ``mx.fast.metal_kernel``.

Registered candidates (offered only where Metal is MLX's default device; importing this
module never needs Metal):

- ``metal_quantize`` (``quantize_activation``): per-token int8 codes, float32 scales and
  optional per-group row sums, one threadgroup per row.
- ``metal_nax_int8_gemm`` (``int8_matmul``, M5-class GPUs): ``matmul2d`` int8 x int8 ->
  int32 on the neural accelerators, the right operand read transposed (``[N, K]`` rows,
  contiguous). ``_32x128``, ``_64x64``, ``_64x128`` and ``_128x128`` suffixes name one threadgroup
  tile each, so the tuner can pick per shape; the plain name picks a tile from the shape.
- ``metal_simd_int8_gemm`` (``int8_matmul``, every Apple GPU): int8 widened to half in
  ``simdgroup_matrix``, float accumulation flushed to int32 every 1024 values of K.
- ``metal_nax_w8a8_gemm`` (and the same four tile suffixes) / ``metal_simd_w8a8_gemm``
  (``linear``, per-channel weights): quantize + the same GEMMs with the dequant (+ bias)
  epilogue fused.
- ``metal_w8a8_gemm_grouped`` (``linear``, grouped affine weights): quantize with row
  sums + GEMM folding each group's exact sums into float32; NAX kernel where NAX is
  present, the simdgroup-matrix kernel elsewhere.
- ``metal_int8_gemv`` (``linear``, M <= 16, either 8-bit format): quantize + a
  memory-bound kernel over the stored codes.
- ``metal_w4a8_gemm`` (``linear``, MLX's 4-bit weights, format ``grouped4``): quantize
  with row sums + the grouped GEMMs reading the packed 4-bit words in place (no int8
  copy of the weight), each group's exact int32 sums promoted in float32 with its scale
  and bias; NAX kernel where NAX is present (the codes unpacked to int8 in registers),
  the simdgroup-matrix kernel elsewhere.
- ``metal_w4a8_gemv`` (``linear``, M <= 16, ``grouped4``): the GEMV on the packed codes.
- ``metal_gemm_act_groups`` (``linear``, 8-bit grouped or 4-bit weights, activation
  groups: ``act_scales="group"`` only): the quantize with one scale per token and
  group, and the grouped GEMMs weighing each group's fold by that scale.

On M1-M4 (no NAX) the int8 GEMMs do the same half-precision MMA work as MLX's own 8-bit
``qmm`` plus a quantize pass, so they are offered honestly but are not expected to win
``linear`` there; which kernel runs without a measurement is the tuner's prior.

Capabilities (:func:`status` reports each with its reason):

- Metal: MLX's default device is the GPU and ``mx.metal.is_available()``; a CPU default
  device offers no Metal candidate.
- NAX (:func:`nax_status`): macOS >= 26.2 (read from the Darwin release when
  ``platform.mac_ver()`` reports the 16.x compatibility version, cpython #135675), GPU
  generation >= 17 (>= 18 for a ``p`` part) from ``mx.device_info()["architecture"]``
  (MLX's ``is_nax_available`` rule), and the real ``nax_gemm`` kernel is exact for every
  tile on a random ragged problem here (:func:`run_nax_probe`). The probe's answer is
  cached on disk per MLX and package version, kernel digest, OS and GPU; a failure that
  may be transient is not cached, and no decision is kept while the CPU is the default
  device.

:func:`override` replaces either capability for tests. How a kernel is launched is one
function, :func:`set_executor`: by default it calls the ``mx.fast.metal_kernel`` object;
the test suite swaps in a Metal emulator so the same launch code runs without Metal.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import re
from typing import Any, Callable

import mlx.core as mx

from .. import cachedir
from . import registry, sources

GEMV_MAX_M = 16
GEMV_ROWS = 4  # output features per SIMD-group in gemv.metal (each activation load feeds 4) ...
GEMV_ROWS_16 = 2  # ... and 2 when MAXM = 16: 2 x 16 x 2 accumulators per lane, not 128
MAX_K = 1 << 17  # |a|, |b| <= 128: K * 2^14 <= 2^31 keeps int32 exact
FLOAT_DTYPES = ("float16", "bfloat16", "float32")
QUANT_THREADS = 256
GEMV_THREADS = 256
GEMM_THREADS = 128
SIMD_TILE = 32  # simd_gemm.metal: 32 x 32 per threadgroup
# NAX threadgroup tiles: name -> (BM, BN, WM, WN); every SIMD-group computes 32 x 32.
NAX_TILES = {"32x128": (32, 128, 1, 4), "64x64": (64, 64, 2, 2), "64x128": (64, 128, 2, 4),
             "128x128": (128, 128, 4, 4)}
# A tile whose pipeline refuses its threadgroup size (MLX checks it against the
# pipeline's maxTotalThreadsPerThreadgroup, which register use can lower below 1024, and
# metal_kernel cannot declare it) is retried with this one (128 threads).
NAX_RETRY_TILE = "64x64"
TOO_MANY_THREADS = "maximum allowed threads per threadgroup"
NAX_MIN_MACOS = (26, 2)

# ---------------------------------------------------------------------------------------
# Capabilities.
# ---------------------------------------------------------------------------------------
_override: dict[str, bool | None] = {"metal": None, "nax": None}


@functools.lru_cache(maxsize=1)
def _metal_built() -> bool:
    try:
        return bool(mx.metal.is_available())
    except Exception:
        return False


def metal_status() -> tuple[bool, str]:
    """``(usable, reason)``: Metal kernels run only where MLX's default device is a
    Metal GPU."""
    if not _metal_built():
        return False, "this MLX build has no Metal backend (mx.metal.is_available() is False)"
    try:
        device = mx.default_device()
    except Exception as error:  # pragma: no cover - MLX always has a default device
        return False, f"no default device ({type(error).__name__}: {error})"
    if device.type != mx.gpu:
        return False, f"MLX's default device is {device}, not the Metal GPU"
    return True, "Metal GPU is MLX's default device"


def macos_version(mac_ver: str, darwin_release: str) -> tuple[int, int] | None:
    """The macOS version as ``(major, minor)``, or None off macOS.

    Pythons built against an SDK older than macOS 26 report the compatibility version
    ``16.x`` from ``platform.mac_ver()`` on macOS 26 (cpython #135675); the Darwin
    release (``os.uname().release``) is then authoritative: Darwin 25.x is macOS 26.x.

    Args:
        mac_ver: ``platform.mac_ver()[0]``, e.g. ``"26.2"``, ``"16.0"`` or ``""``.
        darwin_release: ``os.uname().release``, e.g. ``"25.2.0"``.
    """
    def parse(text: str) -> tuple[int, int] | None:
        try:
            parts = [int(p) for p in text.split(".")[:2]]
        except ValueError:
            return None
        if not parts:
            return None
        return (parts[0], parts[1] if len(parts) > 1 else 0)

    reported = parse(mac_ver) if mac_ver else None
    darwin = parse(darwin_release) if darwin_release else None
    if reported is not None and reported[0] == 16 and darwin is not None and darwin[0] >= 25:
        return (darwin[0] + 1, darwin[1])
    return reported


def gpu_generation(architecture: str) -> tuple[int, str] | None:
    """``(generation, suffix letter)`` of an Apple GPU architecture string such as
    ``"applegpu_g17g"`` (the two digits before the last letter), or None."""
    match = re.fullmatch(r"applegpu_g(\d+)([a-z])", architecture.strip())
    if not match:
        return None
    return int(match.group(1)), match.group(2)


def nax_rule(macos: tuple[int, int] | None, architecture: str) -> tuple[bool, str]:
    """MLX's ``is_nax_available`` rule on plain values: ``(on, reason)``.

    Args:
        macos: ``(major, minor)`` from :func:`macos_version`, None off macOS.
        architecture: ``mx.device_info()["architecture"]``, e.g. ``"applegpu_g17g"``.
    """
    if macos is None:
        return False, "not macOS"
    if macos < NAX_MIN_MACOS:
        return False, f"macOS {macos[0]}.{macos[1]} is older than 26.2"
    gen = gpu_generation(architecture)
    if gen is None:
        return False, f"GPU architecture {architecture!r} is not an Apple GPU generation string"
    need = 18 if gen[1] == "p" else 17
    if gen[0] < need:
        return False, f"GPU generation {gen[0]} ({architecture}) has no neural accelerators (needs >= {need})"
    return True, f"macOS {macos[0]}.{macos[1]}, GPU generation {gen[0]} ({architecture})"


Probe = Callable[[], "tuple[bool, str]"]


def nax_decision(mac_ver: str, darwin_release: str, architecture: str, probe: Probe) -> tuple[bool, str]:
    """The whole NAX decision on injected values; ``probe()`` (the build check) runs only
    when the OS and GPU allow NAX, and an exception from it means off."""
    on, reason = nax_rule(macos_version(mac_ver, darwin_release), architecture)
    if not on:
        return False, reason
    try:
        ok, why = probe()
    except Exception as error:
        return False, f"{reason}; matmul2d probe raised {type(error).__name__}: {error}"
    if not ok:
        return False, f"{reason}; but this MLX build cannot run matmul2d: {why}"
    return True, f"{reason}; nax_gemm probe: {why}"


# The probe's problem: ragged in M, N and K for every tile (M and N not multiples of any
# tile, K not a multiple of the 32-wide K step), so both the unguarded and the guarded
# loads, the K tail and the edge stores all run. Left operands span the whole int8 range.
PROBE_SHAPE = (45, 150, 300)


def run_nax_probe() -> tuple[bool, str, bool]:
    """Run the real ``nax_gemm`` kernel for every tile of ``NAX_TILES`` on a random
    ragged problem and compare each result with exact integer math on the host.

    Returns:
        ``(ok, reason, definitive)``: ``definitive`` is False for a failure that may not
        repeat (an error other than a failed compile or a wrong result: a timeout, memory
        pressure), which is not cached.
    """
    import numpy as np

    m, n, k = PROBE_SHAPE
    rng = np.random.default_rng()
    a = rng.integers(-128, 128, size=(m, k), dtype=np.int8)
    b = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
    want = a.astype(np.int64) @ b.astype(np.int64).T
    exact, smaller = [], []
    for tile in NAX_TILES:
        try:
            got = nax_int8_matmul(mx.array(a), mx.array(b), tile=tile)
            mx.eval(got)
            got = np.array(got).astype(np.int64)
        except Exception as error:
            text = str(error).strip()
            first = text.splitlines()[0][:300] if text else ""
            compile_error = any(word in text for word in ("Unable to build metal library", "error:", "Unable to load"))
            return False, f"tile {tile}: {type(error).__name__}: {first}", compile_error
        # A tile whose pipeline refused its threadgroup size ran as NAX_RETRY_TILE (as it
        # will in use): say so rather than call that tile exact.
        ran_as = _last_nax_tile[0]
        if got.shape != want.shape or not np.array_equal(got, want):
            bad = int(np.sum(got != want)) if got.shape == want.shape else got.size
            where = tile if ran_as == tile else f"{tile} (run as {ran_as})"
            return False, f"tile {where}: {bad} of {want.size} outputs differ from exact integer math", True
        (exact if ran_as == tile else smaller).append(tile)
    why = f"nax_gemm exact on {m}x{n}x{k} for tiles {', '.join(exact)}"
    if smaller:
        why += (f"; tiles {', '.join(smaller)} refused by their pipelines' threadgroup limit "
                f"run as {NAX_RETRY_TILE}")
    return True, why, True


def _probe_cache_path() -> str:
    return os.path.join(cachedir.cache_dir(), "nax_probe.json")


def cached_probe(key: str, probe: Callable[[], "tuple[bool, str, bool]"], path: str | None = None) -> tuple[bool, str]:
    """``probe()`` once per ``key``, remembered in a JSON file; a failure ``probe``
    calls not definitive (its third value) is returned but not remembered.

    A corrupt or unwritable cache file only costs a fresh probe."""
    path = path or _probe_cache_path()
    try:
        with open(path, encoding="utf-8") as f:
            known = json.load(f)
        ok, why = known[key]
        return bool(ok), f"{why} (cached)"
    except Exception:
        known = None
    ok, why, definitive = probe()
    if not ok and not definitive:
        return False, f"{why} (not cached: may be transient)"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = known if isinstance(known, dict) else {}
        data[key] = [bool(ok), why]
        cachedir.write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass
    return ok, why


def nax_probe_key(arch: str, mac_ver: str, darwin: str) -> str:
    """The probe cache's key: what the answer depends on. MLX and package versions, OS,
    GPU, and the digest of the kernel the probe runs (its sources and launch code), so
    an edited kernel or a new release probes again."""
    from .. import __version__

    digest = registry.get("int8_matmul", "metal_nax_int8_gemm").digest
    return f"mlx {mx.__version__} | mlx_w8a8 {__version__} | kernel {digest} | macOS {mac_ver} | darwin {darwin} | {arch}"


def _device_arch() -> str:
    return str(mx.device_info().get("architecture", ""))


def _os_versions() -> tuple[str, str]:
    return platform.mac_ver()[0], os.uname().release


# Decisions per probe key, for this process; only taken while Metal is the default
# device, so a first call on a CPU default device decides nothing for later calls.
_nax_memo: dict[str, tuple[bool, str]] = {}


def _native_nax() -> tuple[bool, str]:
    ok, why = metal_status()
    if not ok:
        return False, why
    try:
        arch = _device_arch()
    except Exception as error:
        return False, f"mx.device_info() failed ({type(error).__name__}: {error})"
    mac_ver, darwin = _os_versions()
    key = nax_probe_key(arch, mac_ver, darwin)
    if key in _nax_memo:
        return _nax_memo[key]
    transient = []

    def probe() -> tuple[bool, str]:
        try:
            ok, why = cached_probe(key, run_nax_probe)
        except Exception:
            transient.append("raised")
            raise
        if why.endswith("(not cached: may be transient)"):
            transient.append(why)
        return ok, why

    decision = nax_decision(mac_ver, darwin, arch, probe)
    if not transient:
        _nax_memo[key] = decision
    return decision


def nax_status() -> tuple[bool, str]:
    """``(on, reason)`` for the NAX kernels here (or what the override forces)."""
    ok, why = metal_status_effective()
    if not ok:
        return False, why
    forced = _override["nax"]
    if forced is not None:
        return forced, f"forced {'on' if forced else 'off'} by metal.override"
    return _native_nax()


def metal_status_effective() -> tuple[bool, str]:
    forced = _override["metal"]
    if forced is not None:
        return forced, f"forced {'on' if forced else 'off'} by metal.override"
    return metal_status()


def metal_available() -> bool:
    """Whether Metal kernels can run here (or the override says so)."""
    return metal_status_effective()[0]


def nax_available() -> bool:
    """Whether the NAX (``matmul2d`` int8) kernels can run here (or the override says so)."""
    return nax_status()[0]


def status() -> dict[str, tuple[bool, str]]:
    """``{"metal": (on, reason), "nax": (on, reason)}`` as a user-facing report."""
    return {"metal": metal_status_effective(), "nax": nax_status()}


@contextlib.contextmanager
def override(metal: bool | None = None, nax: bool | None = None):
    """Pretend Metal / NAX are present (True) or absent (False); None keeps detection.

    Used by tests to reach each dispatch branch. Restores the previous state on exit.
    """
    for name, value in (("metal", metal), ("nax", nax)):
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"[mlx_w8a8.metal.override] {name} must be True, False or None, got {value!r}")
    saved = dict(_override)
    _override.update(metal=metal, nax=nax)
    try:
        yield
    finally:
        _override.update(saved)


# ---------------------------------------------------------------------------------------
# Launching.
# ---------------------------------------------------------------------------------------
Executor = Callable[..., list]


def _call_kernel(kernel, **kwargs):
    if kwargs.get("template") is None:
        kwargs.pop("template", None)
    return kernel(**kwargs)


_executor: Executor = _call_kernel


def set_executor(executor: Executor | None) -> Executor:
    """Install ``executor(kernel, *, inputs, output_shapes, output_dtypes, grid,
    threadgroup, template, init_value) -> list[mx.array]``; None restores the default
    (calling the kernel). Returns the previous one."""
    global _executor
    previous = _executor
    _executor = _call_kernel if executor is None else executor
    return previous


@functools.lru_cache(maxsize=None)
def _kernel(file: str, body: str, inputs: tuple[str, ...], outputs: tuple[str, ...]):
    """The ``mx.fast.metal_kernel`` for ``body`` of ``file`` (built once)."""
    header, bodies = sources.split(sources.read("metal", file), "metal")
    return mx.fast.metal_kernel(
        name=f"w8a8_{body}",
        input_names=list(inputs),
        output_names=list(outputs),
        source=bodies[body],
        header=sources.read("metal", "common.h") + header,
    )


@functools.lru_cache(maxsize=None)
def _dummy(dtype) -> mx.array:
    return mx.zeros((1,), dtype=dtype)


def _as_kernel_input(x: mx.array) -> tuple[mx.array, bool]:
    """Activations as the kernels read them: bfloat16 as its uint16 bits."""
    if x.dtype == mx.bfloat16:
        return mx.contiguous(x).view(mx.uint16), True
    return x, False


def _out_type(dtype) -> tuple[Any, bool]:
    """(kernel output dtype, carried as bfloat16 bits)."""
    return (mx.uint16, True) if dtype == mx.bfloat16 else (dtype, False)


# ---------------------------------------------------------------------------------------
# Runs (signatures: registry.py).
# ---------------------------------------------------------------------------------------
def quantize(x: mx.array, group_size: int | None = None, act_groups: bool = False):
    """Per-token int8 quantization on Metal.

    Args:
        x: ``[M, K]`` float16/bfloat16/float32.
        group_size: None, or 32/64/128 dividing K for per-group row sums.
        act_groups: one scale per token and group of ``group_size`` (needs it) instead
            of one per token (``docs/numerics.md``, activation groups).

    Returns:
        ``(q, scales, row_sums)``: ``[M, K]`` int8, ``[M, 1]`` float32 (``[M, K //
        group_size]`` with ``act_groups``) and ``[M, K // group_size]`` int32 (``None``
        without ``group_size``).
    """
    m, k = x.shape
    gs = int(group_size or 0)
    xin, bf16 = _as_kernel_input(x)
    groups = k // gs if gs else 1
    q, scale, rs = _executor(
        _kernel("quantize.metal", "quantize", ("x",), ("q", "scale", "rs")),
        inputs=[xin],
        template=[("T", xin.dtype), ("BF16", bf16), ("NT", QUANT_THREADS), ("GS", gs),
                  ("AG", bool(act_groups and gs))],
        grid=(QUANT_THREADS, m, 1),
        threadgroup=(QUANT_THREADS, 1, 1),
        output_shapes=[(m, k), (m, groups if act_groups and gs else 1), (m, groups)],
        output_dtypes=[mx.int8, mx.float32, mx.int32],
    )
    return q, scale, (rs if gs else None)


def nax_tile_for(m: int, n: int) -> str:
    """The NAX tile the plain candidate names use: 32 x 128 for small M, 128 x 128 when
    both sides fill several large tiles, 64 x 64 otherwise."""
    if m <= 32:
        return "32x128"
    if m >= 512 and n >= 512:
        return "128x128"
    return "64x64"


def nax_swizzle(tiles_m: int) -> int:
    """log2 of the number of M tiles a run of consecutive threadgroups walks (0..2)."""
    return 2 if tiles_m >= 8 else (1 if tiles_m >= 2 else 0)


_GEMM_INPUTS = ("a", "b", "sa", "sw", "ws", "wo", "rs", "bias")


# Pipelines (template arguments and input bindings) whose threadgroup size MLX refused,
# and those already seen to launch: a tile is checked once per pipeline and process.
_refused: set = set()
_launched: set = set()
# The tile of the last NAX GEMM launched (the retry tile where a pipeline refused one).
_last_nax_tile: list = [None]


def _gemm(nax: bool, a, b, *, flip, mode, gs, out_dtype, sa=None, sw=None, ws=None, wo=None,
          rs=None, bias=None, tile: str | None = None, vec: bool = False, ag: bool = False):
    m, n = a.shape[0], b.shape[0]
    f32 = _dummy(mx.float32)
    kdtype, bf16 = _out_type(out_dtype)
    # GS matters only to grouped weights (MODE 2): one instantiation for the others.
    common = [("TB", b.dtype), ("FLIP", flip), ("MODE", mode), ("GS", gs if mode == 2 else 32),
              ("AG", ag), ("TO", kdtype), ("OUT_BF16", bf16), ("HAS_BIAS", bias is not None)]
    inputs = [a, b, f32 if sa is None else sa, f32 if sw is None else sw,
              f32 if ws is None else ws, f32 if wo is None else wo,
              _dummy(mx.int32) if rs is None else rs, f32 if bias is None else bias]
    if nax:
        tile = tile or nax_tile_for(m, n)
        bm, bn, wm, wn = NAX_TILES[tile]
        tiles_m, tiles_n = -(-m // bm), -(-n // bn)
        swz = nax_swizzle(tiles_m)
        threads = wm * wn * 32
        kernel = _kernel("nax_gemm.metal", "nax_gemm", _GEMM_INPUTS, ("out",))
        template = [("BM", bm), ("BN", bn), ("WM", wm), ("WN", wn)] + common
        grid = ((tiles_n << swz) * threads, -(-tiles_m // (1 << swz)), 1)
    else:
        threads = GEMM_THREADS
        kernel = _kernel("simd_gemm.metal", "simd_gemm", _GEMM_INPUTS, ("out",))
        template = common + [("VEC", vec)]
        grid = (-(-n // SIMD_TILE) * threads, -(-m // SIMD_TILE), 1)
    pipeline = (tuple(template), tuple((str(x.dtype), x.size < 8) for x in inputs))
    if nax and tile != NAX_RETRY_TILE and pipeline in _refused:
        return _gemm(nax, a, b, flip=flip, mode=mode, gs=gs, out_dtype=out_dtype, sa=sa, sw=sw, ws=ws, wo=wo,
                     rs=rs, bias=bias, tile=NAX_RETRY_TILE, vec=vec, ag=ag)
    retry = nax and tile != NAX_RETRY_TILE
    try:
        (out,) = _executor(kernel, inputs=inputs, template=template, grid=grid, threadgroup=(threads, 1, 1),
                           output_shapes=[(m, n)], output_dtypes=[kdtype])
        if retry and pipeline not in _launched:
            # MLX checks the threadgroup size when it encodes the kernel (at evaluation),
            # so the first launch of a pipeline is evaluated here to see it. Any other
            # error of that evaluation (e.g. evaluating inside a function transformation)
            # is left to the caller's own evaluation, as without this check.
            try:
                mx.eval(out)
                _launched.add(pipeline)
            except Exception as error:
                if TOO_MANY_THREADS in str(error):
                    raise
    except Exception as error:
        if not (retry and TOO_MANY_THREADS in str(error)):
            raise
        _refused.add(pipeline)
        return _gemm(nax, a, b, flip=flip, mode=mode, gs=gs, out_dtype=out_dtype, sa=sa, sw=sw, ws=ws, wo=wo,
                     rs=rs, bias=bias, tile=NAX_RETRY_TILE, vec=vec, ag=ag)
    if nax:
        _last_nax_tile[0] = tile
    return out.view(mx.bfloat16) if bf16 else out


def nax_int8_matmul(a: mx.array, b: mx.array, tile: str | None = None) -> mx.array:
    """``a @ b.T`` (``[M, K]``, ``[N, K]`` int8) as exact ``[M, N]`` int32, on NAX.

    Args:
        tile: a key of ``NAX_TILES``, or None to pick one from the shape.
    """
    return _gemm(True, a, b, flip=False, mode=0, gs=32, out_dtype=mx.int32, tile=tile)


def simd_int8_matmul(a: mx.array, b: mx.array) -> mx.array:
    """``a @ b.T`` (``[M, K]``, ``[N, K]`` int8) as exact ``[M, N]`` int32, simdgroup_matrix."""
    return _gemm(False, a, b, flip=False, mode=0, gs=32, out_dtype=mx.int32)


def _bias32(bias):
    return None if bias is None else bias.astype(mx.float32)


def _linear_per_channel(nax: bool, x, weight, bias, tile=None):
    q, sa, _ = quantize(x)
    # Codes and activations of a linear layer have K % 32 == 0 and 4-byte aligned rows
    # (fresh or uint32-backed buffers), so the simd kernel may stage with 4-byte loads.
    return _gemm(nax, q, weight.codes(), flip=True, mode=1, gs=weight.group_size,
                 out_dtype=x.dtype, sa=sa, sw=weight.channel_scales, bias=_bias32(bias),
                 tile=tile, vec=True)


def nax_w8a8_linear(x: mx.array, weight, bias: mx.array | None, tile: str | None = None) -> mx.array:
    """Per-channel W8A8 linear on NAX: ``x`` ``[M, K]`` float -> ``[M, N]`` in x.dtype."""
    return _linear_per_channel(True, x, weight, bias, tile)


def simd_w8a8_linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """Per-channel W8A8 linear with simdgroup_matrix: ``[M, K]`` -> ``[M, N]`` in x.dtype."""
    return _linear_per_channel(False, x, weight, bias)


def _linear_grouped(x: mx.array, weight, bias: mx.array | None, act_groups: bool = False) -> mx.array:
    """Group-wise promotion, one path for 8-bit and 4-bit codes: per-group exact int32
    sums folded into float32 with the group's scale and offset (kernels' MODE 2); with
    ``act_groups`` each fold is weighed by the token's scale for that group."""
    q, sa, rs = quantize(x, weight.group_size, act_groups)
    ws, wo = group_major(weight)
    return _gemm(nax_available(), q, weight_operand(weight), flip=weight.bits == 8, mode=2,
                 gs=weight.group_size, out_dtype=x.dtype, sa=sa, ws=ws, wo=wo, rs=rs,
                 bias=_bias32(bias), vec=True, ag=act_groups)


def act_groups_linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """W8A8 (8-bit grouped) or W4A8 (4-bit) linear with activation groups
    (``act_scales="group"``: one int8 scale per token and weight group,
    ``docs/numerics.md``), through the grouped GEMMs: NAX where NAX is present, the
    simdgroup-matrix kernel elsewhere.

    Args:
        x: ``[M, K]`` float16/bfloat16/float32.
        weight: a group-wise 8-bit or 4-bit ``QuantizedWeight`` ``[N, K]``.
        bias: None or ``[N]``.

    Returns:
        ``[M, N]`` in ``x.dtype``.
    """
    return _linear_grouped(x, weight, bias, act_groups=True)


def grouped_w8a8_linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """Grouped (general affine 8-bit) W8A8 linear; NAX kernel where NAX is present.

    Args:
        x: ``[M, K]`` float16/bfloat16/float32.
        weight: a grouped 8-bit ``QuantizedWeight`` ``[N, K]``.
        bias: None or ``[N]``.

    Returns:
        ``[M, N]`` in ``x.dtype``.
    """
    return _linear_grouped(x, weight, bias)


def w4a8_linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """W4A8 linear on MLX's 4-bit codes as stored (read packed, no int8 copy): per-token
    int8 activations, exact int32 sums per group, promoted per group in float32 with
    ``s_ng`` and ``b_ng`` (``docs/numerics.md``, W4A8). NAX kernel where NAX is present,
    the simdgroup-matrix kernel elsewhere.

    Args:
        x: ``[M, K]`` float16/bfloat16/float32.
        weight: a 4-bit ``QuantizedWeight`` ``[N, K]`` (group size 32, 64 or 128).
        bias: None or ``[N]``.

    Returns:
        ``[M, N]`` in ``x.dtype``.
    """
    return _linear_grouped(x, weight, bias)


def weight_operand(weight) -> mx.array:
    """What the kernels read as the weight: the 8-bit codes ``[N, K]`` uint8 (a view), or
    the 4-bit weight's packed words ``[N, K / 8]`` uint32 as stored."""
    return weight.codes() if weight.bits == 8 else weight.q


def group_offsets(weight) -> mx.array:
    """``[N, G]`` float32 per-group offsets the MODE 2 kernels add times the group's
    activation code sum: ``b + 128 s`` for 8-bit codes (read as ``q - 128``), the stored
    biases ``b`` for 4-bit codes (read as they are)."""
    return weight.group_offsets if weight.bits == 8 else weight.biases.astype(mx.float32)


def group_major(weight) -> tuple[mx.array, mx.array]:
    """The grouped GEMMs' scales and offsets ``[G, N]`` float32 (made once per weight):
    the epilogue's lanes read neighbouring columns of one group, adjacent in this layout
    (MLX stores them ``[N, G]``, a stride of G per column)."""
    return (weight.derived("metal_scales_gn", lambda: mx.contiguous(weight.scales.astype(mx.float32).T)),
            weight.derived("metal_offsets_gn", lambda: mx.contiguous(group_offsets(weight).T)))


def gemv_rows(m: int) -> int:
    """Output features per SIMD-group of the GEMV for ``m`` rows: 4, or 2 at MAXM = 16,
    so a lane's 2 x R x MAXM accumulators stay at 64 registers or fewer."""
    return GEMV_ROWS_16 if gemv_max_m(m) > 8 else GEMV_ROWS


def gemv_max_m(m: int) -> int:
    """The GEMV's register-array length for ``m`` rows: the next of 1, 2, 4, 8, 16."""
    size = 1
    while size < m:
        size *= 2
    return size


def int8_gemv(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """Decode W8A8 linear for ``M <= 16`` rows, per-channel or grouped 8-bit weights.

    Args:
        x: ``[M, K]`` float16/bfloat16/float32, ``1 <= M <= 16``.
        weight: an 8-bit ``QuantizedWeight`` ``[N, K]``.
        bias: None or ``[N]``.

    Returns:
        ``[M, N]`` in ``x.dtype``.
    """
    return _gemv(x, weight, bias, "metal_int8_gemv")


def w4a8_gemv(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """Decode W4A8 linear for ``M <= 16`` rows on MLX's packed 4-bit codes as stored.

    Args:
        x: ``[M, K]`` float16/bfloat16/float32, ``1 <= M <= 16``.
        weight: a 4-bit ``QuantizedWeight`` ``[N, K]``.
        bias: None or ``[N]``.

    Returns:
        ``[M, N]`` in ``x.dtype``.
    """
    return _gemv(x, weight, bias, "metal_w4a8_gemv")


def _gemv(x: mx.array, weight, bias: mx.array | None, name: str) -> mx.array:
    m = x.shape[0]
    if not 1 <= m <= GEMV_MAX_M:
        raise ValueError(f"[mlx_w8a8.linear] {name} takes M in 1..{GEMV_MAX_M} rows, got M = {m}")
    n = weight.n
    grouped = not weight.per_channel
    q, sa, rs = quantize(x, weight.group_size if grouped else None)
    f32 = _dummy(mx.float32)
    kdtype, bf16 = _out_type(x.dtype)
    rows = gemv_rows(m)
    per_group = GEMV_THREADS // 32 * rows
    (out,) = _executor(
        _kernel("gemv.metal", "gemv", ("xq", "sa", "w", "sw", "ws", "wo", "rs", "bias"), ("out",)),
        inputs=[q, sa, weight_operand(weight),
                f32 if grouped else weight.channel_scales,
                weight.scales.astype(mx.float32) if grouped else f32,
                group_offsets(weight) if grouped else f32,
                rs if grouped else _dummy(mx.int32),
                f32 if bias is None else _bias32(bias)],
        template=[("FLIP", weight.bits == 8), ("MODE", 2 if grouped else 1), ("GS", weight.group_size),
                  ("MAXM", gemv_max_m(m)),
                  ("R", rows), ("NT", GEMV_THREADS), ("TO", kdtype), ("OUT_BF16", bf16),
                  ("HAS_BIAS", bias is not None)],
        grid=(-(-n // per_group) * GEMV_THREADS, 1, 1),
        threadgroup=(GEMV_THREADS, 1, 1),
        output_shapes=[(m, n)],
        output_dtypes=[kdtype],
    )
    return out.view(mx.bfloat16) if bf16 else out


# ---------------------------------------------------------------------------------------
# What each candidate takes.
# ---------------------------------------------------------------------------------------
def _sizes_ok(p: registry.Problem) -> bool:
    return p.m >= 1 and p.k >= 1 and p.k <= MAX_K and (p.op == "quantize_activation" or p.n >= 1)


def _supports_quantize(p: registry.Problem) -> bool:
    return (_sizes_ok(p) and p.dtype in FLOAT_DTYPES
            and (p.group_size is None or (p.group_size in (32, 64, 128) and p.k % p.group_size == 0)))


def _supports_int8(p: registry.Problem) -> bool:
    return _sizes_ok(p) and p.weight_format == "int8" and p.dtype == "int8"


def _supports_per_channel(p: registry.Problem) -> bool:
    return (_sizes_ok(p) and p.weight_format == "per_channel" and p.dtype in FLOAT_DTYPES
            and p.k % 32 == 0)


def _supports_grouped(p: registry.Problem) -> bool:
    return (_sizes_ok(p) and p.weight_format == "grouped" and p.dtype in FLOAT_DTYPES
            and p.group_size in (32, 64, 128) and p.k % p.group_size == 0)


def _supports_grouped4(p: registry.Problem) -> bool:
    # K is a multiple of the group size, hence of 8 (whole packed words per row).
    return (_sizes_ok(p) and p.weight_format == "grouped4" and p.dtype in FLOAT_DTYPES
            and p.group_size in (32, 64, 128) and p.k % p.group_size == 0)


def _supports_gemv(p: registry.Problem) -> bool:
    return (p.m <= GEMV_MAX_M and p.weight_format in ("per_channel", "grouped")
            and (_supports_per_channel(p) or _supports_grouped(p)))


def _supports_gemv4(p: registry.Problem) -> bool:
    return p.m <= GEMV_MAX_M and _supports_grouped4(p)


def pick(problem: registry.Problem) -> registry.Candidate | None:
    """The Metal candidate capability alone would use for ``problem`` (before tuning).

    NAX kernels where NAX is present, the simdgroup-matrix kernels on other Apple GPUs,
    the GEMV for decode-sized M; None where no Metal candidate runs ``problem`` here.
    The tuner measures instead of trusting this; it is what the tests of the capability
    override use.
    """
    order = {
        "quantize_activation": ["metal_quantize"],
        "int8_matmul": ["metal_nax_int8_gemm", "metal_simd_int8_gemm"],
        "linear": ["metal_int8_gemv", "metal_w4a8_gemv", "metal_nax_w8a8_gemm", "metal_simd_w8a8_gemm",
                   "metal_w8a8_gemm_grouped", "metal_w4a8_gemm", "metal_gemm_act_groups"],
    }[problem.op]
    for name in order:
        candidate = registry.get(problem.op, name)
        if candidate.handles(problem):
            return candidate
    return None


_CANDIDATES = [  # name, op, run, supports, available
    ("metal_quantize", "quantize_activation", quantize, _supports_quantize, metal_available),
    ("metal_nax_int8_gemm", "int8_matmul", nax_int8_matmul, _supports_int8, nax_available),
    ("metal_simd_int8_gemm", "int8_matmul", simd_int8_matmul, _supports_int8, metal_available),
    ("metal_nax_w8a8_gemm", "linear", nax_w8a8_linear, _supports_per_channel, nax_available),
    ("metal_simd_w8a8_gemm", "linear", simd_w8a8_linear, _supports_per_channel, metal_available),
    ("metal_w8a8_gemm_grouped", "linear", grouped_w8a8_linear, _supports_grouped, metal_available),
    ("metal_int8_gemv", "linear", int8_gemv, _supports_gemv, metal_available),
    ("metal_w4a8_gemm", "linear", w4a8_linear, _supports_grouped4, metal_available),
    ("metal_w4a8_gemv", "linear", w4a8_gemv, _supports_gemv4, metal_available),
]
for _tile in NAX_TILES:
    _CANDIDATES += [
        (f"metal_nax_int8_gemm_{_tile}", "int8_matmul", functools.partial(nax_int8_matmul, tile=_tile),
         _supports_int8, nax_available),
        (f"metal_nax_w8a8_gemm_{_tile}", "linear", functools.partial(nax_w8a8_linear, tile=_tile),
         _supports_per_channel, nax_available),
    ]


def _digest(run) -> str:
    """A candidate's digest (``sources.closure_digest``): the code of this module its run
    function reaches, the kernel files (``.metal``, ``.h``) named in that code, and a
    partial's keywords (the NAX tile)."""
    partial = isinstance(run, functools.partial)
    func = run.func if partial else run
    keywords = repr(sorted(run.keywords.items())) if partial else ""
    return sources.closure_digest((func,), (__name__,), (".metal", ".h"),
                                  lambda f: [sources.read("metal", f)], params=keywords)


for _name, _op, _run, _supports, _avail in _CANDIDATES:
    registry.register(registry.Candidate(
        name=_name, backend="metal", op=_op, run=_run, supports=_supports, digest=_digest(_run),
        available=_avail,
    ))
# Activation groups only (a per-token problem is the grouped candidates').
registry.register(registry.Candidate(
    name="metal_gemm_act_groups", backend="metal", op="linear", run=act_groups_linear,
    supports=lambda p: _supports_grouped(p) or _supports_grouped4(p),
    digest=_digest(act_groups_linear), available=metal_available, act_scales=("group",),
))
