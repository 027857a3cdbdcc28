"""Metal candidates: kernels in ``shaders/metal/*.metal`` run through ``mx.fast.metal_kernel``.

Registered candidates (offered only where Metal is MLX's default device; importing this
module never needs Metal):

- ``metal_quantize`` (``quantize_activation``): per-token int8 codes, float32 scales and
  optional per-group row sums, one threadgroup per row.
- ``metal_nax_int8_gemm`` (``int8_matmul``, M5-class GPUs): ``matmul2d`` int8 x int8 ->
  int32 on the neural accelerators, the right operand read transposed (``[N, K]`` rows,
  contiguous). ``_32x128``, ``_64x64`` and ``_128x128`` suffixes name one threadgroup
  tile each, so the tuner can pick per shape; the plain name picks a tile from the shape.
- ``metal_simd_int8_gemm`` (``int8_matmul``, every Apple GPU): int8 widened to half in
  ``simdgroup_matrix``, float accumulation flushed to int32 every 1024 values of K.
- ``metal_nax_w8a8_gemm`` (and the same three tile suffixes) / ``metal_simd_w8a8_gemm``
  (``linear``, per-channel weights): quantize + the same GEMMs with the dequant (+ bias)
  epilogue fused.
- ``metal_w8a8_gemm_grouped`` (``linear``, grouped affine weights): quantize with row
  sums + GEMM folding each group's exact sums into float32; NAX kernel where NAX is
  present, the simdgroup-matrix kernel elsewhere.
- ``metal_int8_gemv`` (``linear``, M <= 16, either format): quantize + a memory-bound
  kernel over the stored codes.

On M1-M4 (no NAX) the int8 GEMMs do the same half-precision MMA work as MLX's own 8-bit
``qmm`` plus a quantize pass, so they are offered honestly but are not expected to win
``linear`` there; which kernel runs without a measurement is the tuner's prior.

Capabilities (:func:`status` reports each with its reason):

- Metal: MLX's default device is the GPU and ``mx.metal.is_available()``; a CPU default
  device offers no Metal candidate.
- NAX (:func:`nax_status`): macOS >= 26.2 (read from the Darwin release when
  ``platform.mac_ver()`` reports the 16.x compatibility version, cpython #135675), GPU
  generation >= 17 (>= 18 for a ``p`` part) from ``mx.device_info()["architecture"]``
  (MLX's ``is_nax_available`` rule), and this MLX build compiles and runs a one-line
  ``matmul2d`` kernel (a build for an older deployment target leaves NAX out). The probe
  runs once per MLX version and its answer is cached on disk.

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
GEMV_ROWS = 4  # output features per SIMD-group in gemv.metal (each activation load feeds 4)
MAX_K = 1 << 17  # |a|, |b| <= 128: K * 2^14 <= 2^31 keeps int32 exact
FLOAT_DTYPES = ("float16", "bfloat16", "float32")
QUANT_THREADS = 256
GEMV_THREADS = 256
GEMM_THREADS = 128
SIMD_TILE = 32  # simd_gemm.metal: 32 x 32 per threadgroup
# NAX threadgroup tiles: name -> (BM, BN, WM, WN); every SIMD-group computes 32 x 32.
NAX_TILES = {"32x128": (32, 128, 1, 4), "64x64": (64, 64, 2, 2), "128x128": (128, 128, 4, 4)}
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
    return True, f"{reason}; matmul2d int8 probe passed"


_PROBE_SOURCE = """
constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(
    16, 32, 16, false, true, true, mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
mpp::tensor_ops::matmul2d<desc, metal::execution_simdgroup> op;
auto ct_a = op.get_left_input_cooperative_tensor<int8_t, int8_t, int32_t>();
auto ct_b = op.get_right_input_cooperative_tensor<int8_t, int8_t, int32_t>();
auto ct_c = op.get_destination_cooperative_tensor<
    metal::remove_addrspace_t<decltype(ct_a)>, metal::remove_addrspace_t<decltype(ct_b)>, int32_t>();
for (short i = 0; i < 8; ++i) { ct_a[i] = ones[0]; }
for (short i = 0; i < 16; ++i) { ct_b[i] = ones[0]; ct_c[i] = 0; }
op.run(ct_a, ct_b, ct_c);
out[thread_index_in_simdgroup] = ct_c[0];
"""


def run_nax_probe() -> tuple[bool, str]:
    """Compile and run a one-line ``matmul2d`` int8 kernel through the executor;
    every lane must read 16 (a 16-long dot product of ones)."""
    kernel = mx.fast.metal_kernel(
        name="w8a8_nax_probe", input_names=["ones"], output_names=["out"], source=_PROBE_SOURCE,
        header="#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>\n")
    try:
        (out,) = _executor(kernel, inputs=[mx.ones((8,), dtype=mx.int8)], output_shapes=[(32,)],
                           output_dtypes=[mx.int32], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                           template=None, init_value=None)
        got = [int(v) for v in out.tolist()]
    except Exception as error:
        return False, f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300] if str(error).strip() else ''}"
    if got != [16] * 32:
        return False, f"matmul2d gave {got[:4]}..., expected 16 in every lane"
    return True, "ok"


def _probe_cache_path() -> str:
    return os.path.join(cachedir.cache_dir(), "nax_probe.json")


def cached_probe(key: str, probe: Probe, path: str | None = None) -> tuple[bool, str]:
    """``probe()`` once per ``key`` (MLX version, OS and GPU), remembered in a JSON file.

    A corrupt or unwritable cache file only costs a fresh probe."""
    path = path or _probe_cache_path()
    try:
        with open(path, encoding="utf-8") as f:
            known = json.load(f)
        ok, why = known[key]
        return bool(ok), f"{why} (cached)"
    except Exception:
        known = None
    ok, why = probe()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = known if isinstance(known, dict) else {}
        data[key] = [bool(ok), why]
        cachedir.write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass
    return ok, why


@functools.lru_cache(maxsize=1)
def _native_nax() -> tuple[bool, str]:
    ok, why = metal_status()
    if not ok:
        return False, why
    try:
        arch = str(mx.device_info().get("architecture", ""))
    except Exception as error:
        return False, f"mx.device_info() failed ({type(error).__name__}: {error})"
    mac_ver, darwin = platform.mac_ver()[0], os.uname().release
    key = f"mlx {mx.__version__} | macOS {mac_ver} | darwin {darwin} | {arch}"
    return nax_decision(mac_ver, darwin, arch, lambda: cached_probe(key, run_nax_probe))


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
def quantize(x: mx.array, group_size: int | None = None):
    """Per-token int8 quantization on Metal.

    Args:
        x: ``[M, K]`` float16/bfloat16/float32.
        group_size: None, or 32/64/128 dividing K for per-group row sums.

    Returns:
        ``(q, scales, row_sums)``: ``[M, K]`` int8, ``[M, 1]`` float32 and ``[M, K //
        group_size]`` int32 (``None`` without ``group_size``).
    """
    m, k = x.shape
    gs = int(group_size or 0)
    xin, bf16 = _as_kernel_input(x)
    groups = k // gs if gs else 1
    q, scale, rs = _executor(
        _kernel("quantize.metal", "quantize", ("x",), ("q", "scale", "rs")),
        inputs=[xin],
        template=[("T", xin.dtype), ("BF16", bf16), ("NT", QUANT_THREADS), ("GS", gs)],
        grid=(QUANT_THREADS, m, 1),
        threadgroup=(QUANT_THREADS, 1, 1),
        output_shapes=[(m, k), (m, 1), (m, groups)],
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


def _gemm(nax: bool, a, b, *, flip, mode, gs, out_dtype, sa=None, sw=None, ws=None, wo=None,
          rs=None, bias=None, tile: str | None = None, vec: bool = False):
    m, n = a.shape[0], b.shape[0]
    f32 = _dummy(mx.float32)
    kdtype, bf16 = _out_type(out_dtype)
    common = [("TB", b.dtype), ("FLIP", flip), ("MODE", mode), ("GS", gs), ("TO", kdtype),
              ("OUT_BF16", bf16), ("HAS_BIAS", bias is not None)]
    if nax:
        bm, bn, wm, wn = NAX_TILES[tile or nax_tile_for(m, n)]
        tiles_m, tiles_n = -(-m // bm), -(-n // bn)
        swz = nax_swizzle(tiles_m)
        threads = wm * wn * 32
        kernel = _kernel("nax_gemm.metal", "nax_gemm", _GEMM_INPUTS, ("out",))
        template = [("BM", bm), ("BN", bn), ("WM", wm), ("WN", wn), ("SWZ", swz)] + common
        grid = ((tiles_n << swz) * threads, -(-tiles_m // (1 << swz)), 1)
    else:
        threads = GEMM_THREADS
        kernel = _kernel("simd_gemm.metal", "simd_gemm", _GEMM_INPUTS, ("out",))
        template = common + [("VEC", vec)]
        grid = (-(-n // SIMD_TILE) * threads, -(-m // SIMD_TILE), 1)
    (out,) = _executor(
        kernel,
        inputs=[a, b, f32 if sa is None else sa, f32 if sw is None else sw,
                f32 if ws is None else ws, f32 if wo is None else wo,
                _dummy(mx.int32) if rs is None else rs, f32 if bias is None else bias],
        template=template,
        grid=grid,
        threadgroup=(threads, 1, 1),
        output_shapes=[(m, n)],
        output_dtypes=[kdtype],
    )
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


def grouped_w8a8_linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """Grouped (general affine 8-bit) W8A8 linear; NAX kernel where NAX is present."""
    q, sa, rs = quantize(x, weight.group_size)
    return _gemm(nax_available(), q, weight.codes(), flip=True, mode=2, gs=weight.group_size,
                 out_dtype=x.dtype, sa=sa, ws=weight.scales.astype(mx.float32),
                 wo=weight.group_offsets, rs=rs, bias=_bias32(bias), vec=True)


def gemv_max_m(m: int) -> int:
    """The GEMV's register-array length for ``m`` rows: the next of 1, 2, 4, 8, 16."""
    size = 1
    while size < m:
        size *= 2
    return size


def int8_gemv(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """Decode W8A8 linear for ``M <= 16`` rows, per-channel or grouped weights."""
    m = x.shape[0]
    if not 1 <= m <= GEMV_MAX_M:
        raise ValueError(f"[mlx_w8a8.linear] metal_int8_gemv takes M in 1..{GEMV_MAX_M} rows, got M = {m}")
    n = weight.n
    grouped = not weight.per_channel
    q, sa, rs = quantize(x, weight.group_size if grouped else None)
    f32 = _dummy(mx.float32)
    kdtype, bf16 = _out_type(x.dtype)
    per_group = GEMV_THREADS // 32 * GEMV_ROWS
    (out,) = _executor(
        _kernel("gemv.metal", "gemv", ("xq", "sa", "w", "sw", "ws", "wo", "rs", "bias"), ("out",)),
        inputs=[q, sa, weight.codes(),
                f32 if grouped else weight.channel_scales,
                weight.scales.astype(mx.float32) if grouped else f32,
                weight.group_offsets if grouped else f32,
                rs if grouped else _dummy(mx.int32),
                f32 if bias is None else _bias32(bias)],
        template=[("MODE", 2 if grouped else 1), ("GS", weight.group_size), ("MAXM", gemv_max_m(m)),
                  ("R", GEMV_ROWS), ("NT", GEMV_THREADS), ("TO", kdtype), ("OUT_BF16", bf16),
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


def _supports_gemv(p: registry.Problem) -> bool:
    return (p.m <= GEMV_MAX_M and p.weight_format in ("per_channel", "grouped")
            and (_supports_per_channel(p) or _supports_grouped(p)))


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
        "linear": ["metal_int8_gemv", "metal_nax_w8a8_gemm", "metal_simd_w8a8_gemm",
                   "metal_w8a8_gemm_grouped"],
    }[problem.op]
    for name in order:
        candidate = registry.get(problem.op, name)
        if candidate.handles(problem):
            return candidate
    return None


_NAX = ("nax_gemm.metal",)
_SIMD = ("simd_gemm.metal",)
_Q = ("quantize.metal",)
_GV = ("gemv.metal",)
# Python each candidate executes besides its run function (hashed into its digest).
_LAUNCH = (_kernel, _dummy, _as_kernel_input, _out_type, _bias32, quantize)
_GEMM = _LAUNCH + (_gemm,)
_NAXF = _GEMM + (nax_tile_for, nax_swizzle)
_CANDIDATES = [  # name, op, run, (functions digested), supports, kernel files, available
    ("metal_quantize", "quantize_activation", quantize, _LAUNCH, _supports_quantize, _Q, metal_available),
    ("metal_nax_int8_gemm", "int8_matmul", nax_int8_matmul, _NAXF, _supports_int8, _NAX, nax_available),
    ("metal_simd_int8_gemm", "int8_matmul", simd_int8_matmul, _GEMM, _supports_int8, _SIMD, metal_available),
    ("metal_nax_w8a8_gemm", "linear", nax_w8a8_linear, _NAXF + (_linear_per_channel,), _supports_per_channel,
     _Q + _NAX, nax_available),
    ("metal_simd_w8a8_gemm", "linear", simd_w8a8_linear, _GEMM + (_linear_per_channel,), _supports_per_channel,
     _Q + _SIMD, metal_available),
    ("metal_w8a8_gemm_grouped", "linear", grouped_w8a8_linear, _NAXF, _supports_grouped, _Q + _NAX + _SIMD,
     metal_available),
    ("metal_int8_gemv", "linear", int8_gemv, _LAUNCH + (gemv_max_m,), _supports_gemv, _Q + _GV, metal_available),
]
for _tile in NAX_TILES:
    _CANDIDATES += [
        (f"metal_nax_int8_gemm_{_tile}", "int8_matmul", functools.partial(nax_int8_matmul, tile=_tile),
         _NAXF + (nax_int8_matmul,), _supports_int8, _NAX, nax_available),
        (f"metal_nax_w8a8_gemm_{_tile}", "linear", functools.partial(nax_w8a8_linear, tile=_tile),
         _NAXF + (nax_w8a8_linear, _linear_per_channel), _supports_per_channel, _Q + _NAX, nax_available),
    ]
_PARAMS = f"{QUANT_THREADS}/{GEMV_THREADS}/{GEMV_ROWS}/{GEMM_THREADS}/{SIMD_TILE}/{NAX_TILES}/{MAX_K}"
for _name, _op, _run, _fns, _supports, _files, _avail in _CANDIDATES:
    _functions = _fns if isinstance(_run, functools.partial) else (_run, *_fns)
    registry.register(registry.Candidate(
        name=_name, backend="metal", op=_op, run=_run, supports=_supports,
        digest=sources.code_digest(*_functions, texts=tuple(sources.read("metal", f) for f in ("common.h", *_files)),
                                   params=f"{_name} {_PARAMS}"),
        available=_avail,
    ))
