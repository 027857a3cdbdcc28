"""Shared CUDA launch code: kernel files, kernel objects, launch specs and device probes.

Kernel source files hold a header and one or more named bodies (:func:`sources.split`);
MLX wraps each body into a ``__global__`` function (``mlx/backend/cuda/custom_kernel.cpp``).
Sizes reach the kernels through MLX's ``<input>_shape`` arguments, so no scalar arrays
are created per call. Each launch is described by a :class:`LaunchSpec` computed from the
problem's sizes, dtype and weight (the ``*_spec`` functions of the family modules:
:mod:`.quantize`, :mod:`.gemm`, :mod:`.gemm_ws`, :mod:`.gemm_grouped`, :mod:`.gemv`);
a kernel definition (:mod:`.kernel`) launches it on every call or binds it once.
Importing this module never needs CUDA.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import mlx.core as mx

from ... import backends, cachedir
from .. import sources


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

FLOAT_DTYPES = ("float16", "bfloat16", "float32")


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
    """True when MLX has a CUDA device and uses the GPU by default
    (:func:`mlx_w8a8.backends.on_cuda`): every CUDA candidate's ``available``, kept
    under this name so the kernel modules have one probe to patch (``bench/launch_diff.py``
    records launches with it answering True)."""
    return backends.on_cuda()


@functools.lru_cache(maxsize=None)
def is_sm90() -> bool:
    """Whether the default GPU is compute capability 9.x (wgmma needs sm_90a)."""
    try:
        return int(mx.device_info().get("compute_capability_major", 0)) == 9
    except Exception:
        return False


# Members of one sibling launch (gemm_ws.cu's group bodies): q/k/v or gate/up.
MAX_SIBLINGS = 3

SMS = 132  # persistent grid size (an H200's SM count; any GPU runs it correctly)


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


def as_f32(a: mx.array) -> mx.array:
    return a if a.dtype == mx.float32 else a.astype(mx.float32)


# Launch specs ---------------------------------------------------------------------------
def leading_shape(m: int, lead: tuple[int, ...] | None) -> tuple[int, ...]:
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


def sibling_bias(op: str, members: list) -> bool:
    """Whether the ``(weight, bias)`` pairs of one sibling launch have a bias (all of
    them or none).

    Raises:
        ValueError: for fewer than 2 or more than ``MAX_SIBLINGS`` members, or a bias on
            some members only (``op`` names the kernel).
    """
    if not 2 <= len(members) <= MAX_SIBLINGS:
        raise ValueError(f"{op} a sibling launch takes 2 to {MAX_SIBLINGS} weights, "
                         f"got {len(members)}")
    has_bias = {b is not None for _, b in members}
    if len(has_bias) != 1:
        raise ValueError(f"{op} sibling weights must all have a bias or none, got "
                         f"{[b is not None for _, b in members]}")
    return True in has_bias


class LaunchSpec(NamedTuple):
    """One kernel launch with everything fixed but its leading (activation) inputs.

    Built from the problem's sizes, dtype and weight alone, so a layer builds it once
    (a definition's ``bind``, :mod:`.kernel`) and each call only adds its activations:
    the launch is ``kernel(inputs=[*activations, *tail], template=..., ...)``.

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
FRAME_CACHE = 4096


def framed(frame: LaunchSpec, tail: tuple = ()) -> LaunchSpec:
    """The spec of a cached frame: its kernel built (or found) from the arguments it
    holds, ``tail`` (the weight's arrays) before the frame's own tail."""
    return frame._replace(kernel=_kernel(*frame.kernel), tail=tail + frame.tail)
