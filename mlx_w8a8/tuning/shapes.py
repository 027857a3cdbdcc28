"""Problem shapes: the presets of ``tune --shapes``, ``MxNxK`` parsing and M buckets.

Shapes follow the weight convention of the package: a projection ``y = x @ W.T`` with
``W`` ``[N, K]`` (N output features, K input features) and ``x`` ``[M, K]`` (M tokens).

Presets are the linear projections of three common open LLM families, from their
published configs:

=============  ======  ============  =====  ========  ========  =============================
family         hidden  intermediate  heads  kv heads  head dim  projections (N x K)
=============  ======  ============  =====  ========  ========  =============================
Llama-3-8B     4096    14336         32     8         128       q/o 4096x4096, k/v 1024x4096,
                                                                gate/up 14336x4096,
                                                                down 4096x14336
Mistral-7B     4096    14336         32     8         128       the same as Llama-3-8B
Qwen2.5-7B     3584    18944         28     4         128       q/o 3584x3584, k/v 512x3584,
                                                                gate/up 18944x3584,
                                                                down 3584x18944
=============  ======  ============  =====  ========  ========  =============================

M is bucketed to powers of two up to ``M_CAP``; a table stores measured buckets and a
lookup snaps to the nearest measured one (:func:`nearest_bucket`). The buckets measured
when none are named (:func:`default_m`) cover decode, batched decode and prefill on a
GPU (``GPU_M``: 1, 2, 4, ..., 4096, which holds ``DECODE_BATCH_M`` = 2 ... 64, the rows
a server's batched decode runs per linear) and decode plus a short prompt on a CPU
(``CPU_M``: 1 and 4), where one bfloat16 ``mx.quantized_matmul`` of a 4096 x 4096
projection takes about 0.9 s at M = 4 on 2 cores.

Tensor parallelism (:func:`split_for_tp`) follows mlx-lm's ``shard()``: column-parallel
projections (q/k/v, gate/up) keep K and split N across ranks, row-parallel ones (o,
down) split K; the others (``lm_head``) are not split.
"""

from __future__ import annotations

import math
import re

# (N, K) per projection, per family. Duplicate shapes (gate = up, q = o, Mistral =
# Llama) are measured once.
FAMILIES: dict[str, dict[str, list[tuple[int, int]]]] = {
    "llama-3-8b": {
        "attn": [(4096, 4096), (1024, 4096)],
        "mlp": [(14336, 4096), (4096, 14336)],
    },
    "mistral-7b": {
        "attn": [(4096, 4096), (1024, 4096)],
        "mlp": [(14336, 4096), (4096, 14336)],
    },
    "qwen2.5-7b": {
        "attn": [(3584, 3584), (512, 3584)],
        "mlp": [(18944, 3584), (3584, 18944)],
    },
}
PRESETS = ("mlp", "attn", "all")
# Token counts measured when none are given (see :func:`default_m`).
# Rows per linear of batched decode: mlx-lm's server decodes up to 32 sequences at once by
# default (``--decode-concurrency 32``; 64 covers a doubled setting), one row each.
DECODE_BATCH_M = (2, 4, 8, 16, 32, 64)
# 1 (single-stream decode), the batched-decode buckets, then prefill up to 4096: every
# power of two from 1 to 4096.
GPU_M = tuple(sorted({1, *DECODE_BATCH_M, *(1 << i for i in range(7, 13))}))
CPU_M = (1, 4)  # decode and a short prompt; larger M takes minutes per shape there
M_CAP = 8192

# Projection names by how mlx-lm's ``shard()`` splits them across tensor-parallel ranks.
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj",
                   "gate_up_proj", "wq", "wk", "wv", "w1", "w3", "fc1", "c_fc")
ROW_PARALLEL = ("o_proj", "down_proj", "out_proj", "wo", "w2", "fc2", "c_proj", "dense")

_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def default_m(backend: str | None = None) -> tuple[int, ...]:
    """The M buckets measured when none are named: ``GPU_M`` on a GPU, ``CPU_M`` on a CPU.

    Args:
        backend: ``"cpu"``, ``"cuda"``, ``"metal"``...; default: MLX's default device.
    """
    if backend is None:
        import mlx.core as mx

        backend = "cpu" if mx.default_device().type == mx.DeviceType.cpu else "gpu"
    return CPU_M if backend == "cpu" else GPU_M


def split_for_tp(name: str, n: int, k: int, tp: int) -> tuple[int, int]:
    """``(N, K)`` of projection ``name`` on one of ``tp`` tensor-parallel ranks.

    Column-parallel projections (``COLUMN_PARALLEL``: q/k/v, gate/up) give ``(N / tp,
    K)``, row-parallel ones (``ROW_PARALLEL``: o, down) ``(N, K / tp)``; others (e.g.
    ``lm_head``) are not split.

    Args:
        name: the layer's attribute name (the last part of its path).
        n, k: the full projection's output and input features.
        tp: ranks, >= 1.

    Raises:
        ValueError: if ``tp < 1`` or the split dimension is not divisible by ``tp``.
    """
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"[mlx_w8a8.tune] tp must be a positive int, got {tp!r}")
    if tp == 1:
        return n, k
    if name in COLUMN_PARALLEL:
        dim, label = n, "N"
    elif name in ROW_PARALLEL:
        dim, label = k, "K"
    else:
        return n, k
    if dim % tp:
        raise ValueError(
            f"[mlx_w8a8.tune] {name} ({n}x{k}) cannot be split across tp={tp} ranks: "
            f"{label} = {dim} is not divisible by {tp}"
        )
    return (n // tp, k) if label == "N" else (n, k // tp)


def preset(name: str, prog: str = "mlx_w8a8.tune") -> list[tuple[int, int]]:
    """The distinct ``(N, K)`` projection shapes of preset ``name``, in family order.

    Args:
        name: ``"mlp"``, ``"attn"`` or ``"all"``.
        prog: the command or op named in errors.

    Raises:
        ValueError: for any other name.
    """
    if name not in PRESETS:
        raise ValueError(f"[{prog}] unknown shape preset {name!r}; presets: {list(PRESETS)}")
    parts = ("attn", "mlp") if name == "all" else (name,)
    seen: list[tuple[int, int]] = []
    for family in FAMILIES.values():
        for part in parts:
            for shape in family[part]:
                if shape not in seen:
                    seen.append(shape)
    return seen


def parse_shape(text: str, prog: str = "mlx_w8a8.tune") -> tuple[int, int, int]:
    """Parse ``"MxNxK"`` (M tokens, N output features, K input features); ``prog`` is
    the command named in errors.

    Raises:
        ValueError: when the text is not three positive integers joined by ``x``.
    """
    match = _SHAPE.match(text)
    if not match or min(int(g) for g in match.groups()) <= 0:
        raise ValueError(
            f"[{prog}] shape must be MxNxK with positive integers (e.g. 1x4096x4096), "
            f"got {text!r}"
        )
    m, n, k = (int(g) for g in match.groups())
    return m, n, k


def parse_m_list(text: str) -> list[int]:
    """Parse a comma-separated list of token counts, e.g. ``"1,16,128"``.

    Raises:
        ValueError: on an empty list, a non-integer or a value < 1.
    """
    values = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise ValueError(
                f"[mlx_w8a8.tune] --m takes positive integers separated by commas, got {text!r}"
            )
        values.append(int(part))
    if not values:
        raise ValueError(f"[mlx_w8a8.tune] --m needs at least one token count, got {text!r}")
    return sorted(set(values))


def expand(
    specs: list[str], m_values: list[int] | None = None, *, prog: str = "mlx_w8a8.tune",
    flag: str = "--shapes",
) -> list[tuple[int, int, int]]:
    """Turn ``--shapes`` arguments into a list of distinct ``(M, N, K)``.

    Args:
        specs: preset names and/or ``MxNxK`` strings (a comma inside one argument also
            separates). Presets are crossed with ``m_values``; an explicit ``MxNxK``
            keeps its own M.
        m_values: token counts for presets (default :func:`default_m`).
        prog, flag: the command and its option, named in errors.

    Raises:
        ValueError: on an unknown preset or a malformed shape.
    """
    ms = list(m_values) if m_values else list(default_m())
    out: list[tuple[int, int, int]] = []
    for spec in specs:
        for item in str(spec).split(","):
            item = item.strip()
            if not item:
                continue
            if item in PRESETS:
                shapes = [(m, n, k) for (n, k) in preset(item, prog) for m in ms]
            else:
                shapes = [parse_shape(item, prog)]
            for shape in shapes:
                if shape not in out:
                    out.append(shape)
    if not out:
        raise ValueError(f"[{prog}] {flag} named no shape, got {specs!r}")
    return out


def bucket(m: int, cap: int = M_CAP) -> int:
    """The M bucket of ``m``: the smallest power of two >= ``m``, at most ``cap``.

    Raises:
        ValueError: if ``m < 1``.
    """
    if m < 1:
        raise ValueError(f"[mlx_w8a8.tuning] M must be >= 1 to bucket, got {m}")
    return min(1 << (int(m) - 1).bit_length(), cap)


def decode_apart(measured_bucket: int, m: int) -> bool:
    """Whether an entry of ``measured_bucket`` may speak for ``m`` as far as batch 1 goes:
    the M = 1 bucket only for ``m == 1``, and ``m == 1`` only by it (decode at batch 1 is
    decided in the model's own decode loop; its choice says nothing about batched rows,
    nor theirs about it)."""
    return (measured_bucket == 1) == (m == 1)


def nearest_bucket(m: int, measured, cap: int = M_CAP) -> int | None:
    """The measured bucket nearest to ``bucket(m)`` in log2 distance (ties: larger),
    among those :func:`decode_apart` lets speak for ``m``.

    Args:
        m: the token count at run time.
        measured: the M buckets a table holds for this (N, K, ...).

    Returns:
        The bucket to use, or ``None`` if ``measured`` is empty.
    """
    measured = sorted(b for b in set(int(b) for b in measured) if decode_apart(b, m))
    if not measured:
        return None
    target = math.log2(bucket(m, cap))
    return min(measured, key=lambda b: (abs(math.log2(b) - target), -b))
