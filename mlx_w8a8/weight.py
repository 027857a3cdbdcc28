"""The weight storage: MLX's affine layouts, 8-bit and 4-bit.

``w[n, k] = scales[n, g] * q[n, k] + biases[n, g]`` with ``g = k // group_size`` and
``q`` in ``[0, 255]`` packed four to a uint32 (element order: ``q.view(mx.uint8)`` is
``[N, K]``). This is what ``mx.quantize(w, bits=8)`` writes and what every mlx-lm 8-bit
checkpoint holds, so a checkpoint written by this package loads in stock mlx-lm.

The 4-bit layout (``bits=4``, what ``mx.quantize(w, bits=4)`` writes and most mlx-lm
checkpoints hold) is the same formula with ``q`` in ``[0, 15]`` packed eight to a
uint32, code ``j`` of a word in bits ``4j .. 4j + 3`` (so byte ``i`` of a row holds
element ``2i`` in its low nibble and ``2i + 1`` in its high one). Its W8A8 math is the
per-group one of ``docs/numerics.md`` (format ``"grouped4"``); the arrays are kept as
stored.

Symmetric per-channel int8 (``w = s_n * w_i8``, ``w_i8`` in ``[-127, 127]``) is the
special case ``q = w_i8 + 128``, every group of row ``n`` with ``scale = s_n`` and
``bias = -128 * s_n``. Int8 kernels read ``q ^ 0x80`` (``= q - 128`` as int8): there is
no second copy of the weights.
"""

from __future__ import annotations

import functools
import numbers

import attrs
import mlx.core as mx


GROUP_SIZES = (32, 64, 128)
# The code widths of MLX's affine layouts this package runs.
BITS = (4, 8)
# Weight formats by the math that applies (``QuantizedWeight.format``).
PER_CHANNEL, GROUPED, GROUPED4 = "per_channel", "grouped", "grouped4"
# The float dtypes of activations, scales and biases: the one table of the package
# (kernels and tuning import these names; do not copy them).
FLOAT_DTYPES_BY_NAME = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
FLOAT_DTYPES = tuple(FLOAT_DTYPES_BY_NAME.values())
FLOAT_DTYPE_NAMES = tuple(FLOAT_DTYPES_BY_NAME)
# Exclusive bound on K for an int32 sum of int8 products: |a|, |b| <= 128 gives
# |sum| <= K * 2^14, which is below 2^31 for every K < 2^17 (and reaches it at 2^17).
MAX_K = 1 << 17
# Inclusive bound on K for a per-channel W8A8 linear that accumulates the whole row in
# int32: activation codes |a| <= 127 (quantize never writes -128) times weight codes
# |w| <= 128 sum to at most 127 * 128 * K, which is <= 2^31 - 1 for K <= 132104. Grouped
# kernels promote each group's int32 sum (|sum| <= 127 * 128 * group_size) to float32,
# so they have no such bound. ``registry.Candidate.handles`` enforces it for every W8A8
# candidate (docs/numerics.md).
LINEAR_MAX_K = (2**31 - 1) // (127 * 128)
assert LINEAR_MAX_K == 132104


def dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).removeprefix("mlx.core.")


def describe(value) -> str:
    if isinstance(value, mx.array):
        return f"{dtype_name(value.dtype)} array of shape {tuple(value.shape)}"
    return type(value).__name__


def check_group_size(op: str, group_size, k: int) -> int:
    """Validate ``group_size`` for an ``[*, k]`` weight; returns it as an int.

    Raises:
        ValueError: naming ``op`` when the group size is not an int of ``GROUP_SIZES``,
            K is not positive, or the group size does not divide K.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or (
        group_size not in GROUP_SIZES
    ):
        raise ValueError(
            f"[{op}] group_size must be one of {GROUP_SIZES} (an int), got {group_size!r} "
            f"({type(group_size).__name__})"
        )
    if k < 1:
        raise ValueError(
            f"[{op}] K must be a positive multiple of the group size {group_size}, got K = {k}"
        )
    if k % group_size != 0:
        raise ValueError(
            f"[{op}] group_size {group_size} does not divide K = {k}; the affine "
            f"format needs K to be a multiple of the group size"
        )
    return int(group_size)


@attrs.frozen(slots=False, eq=False)
class QuantizedWeight:
    """A ``[N, K]`` weight in MLX's affine 8-bit (or 4-bit) layout.

    Args:
        q: ``[N, K * bits // 32]`` uint32: four 8-bit codes per word (element order),
            or eight 4-bit codes per word (code ``j`` in bits ``4j .. 4j + 3``).
        scales: ``[N, K // group_size]`` float16/bfloat16/float32.
        biases: ``[N, K // group_size]``, same dtype as ``scales``.
        group_size: 32, 64 or 128.
        per_channel: whether the weight is symmetric per-channel int8 (one scale per
            row, ``bias == -128 * scale``). ``None`` (the default) detects it, which
            evaluates ``scales`` and ``biases`` once; pass it when it is known. Always
            ``False`` for 4-bit weights.
        bits: keyword only: 8 (the default) or 4, the width of the codes in ``q``.
            The arrays are kept as given (a 4-bit weight is not widened).

    Raises:
        ValueError: on a wrong dtype, a shape that does not match, a bad group size,
            or ``bits`` not 4 or 8 or not the width ``q`` holds.
    """

    q: mx.array
    scales: mx.array
    biases: mx.array
    group_size: int
    per_channel: bool = attrs.field(default=None)
    bits: int = attrs.field(default=8, kw_only=True)
    # ops.w8a8_linear's plans for this weight (a mlx_w8a8.plans.PlanCache, made on the
    # first call: plans imports the registry, which imports this module); not part of
    # the value: not compared, not copied by attrs.evolve.
    _plans: object = attrs.field(default=None, init=False, repr=False, eq=False)
    # Arrays a backend derives from these once and keeps with them (derived()).
    _derived: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)

    def __attrs_post_init__(self):
        op = "mlx_w8a8.QuantizedWeight"
        if isinstance(self.bits, bool) or self.bits not in BITS:
            raise ValueError(f"[{op}] bits must be one of {BITS}, got {self.bits!r}")
        per_word = 32 // self.bits
        if not isinstance(self.q, mx.array) or self.q.dtype != mx.uint32 or self.q.ndim != 2:
            raise ValueError(
                f"[{op}] q must be a [N, K // {per_word}] uint32 array (MLX's packed "
                f"{self.bits}-bit codes), got {describe(self.q)}"
            )
        n, k = self.q.shape[0], self.q.shape[1] * per_word
        check_group_size(op, self.group_size, k)
        want = (n, k // self.group_size)
        for label, arr in (("scales", self.scales), ("biases", self.biases)):
            if not isinstance(arr, mx.array) or arr.dtype not in FLOAT_DTYPES:
                raise ValueError(
                    f"[{op}] {label} must be a float16, bfloat16 or float32 array, "
                    f"got {describe(arr)}"
                )
            bits = _packed_bits(self.q, self.scales, self.biases, self.group_size)
            if bits is not None and bits != self.bits:
                fix = (f"pass bits={bits}" if bits in BITS else
                       f"quantize the float weight with bits=8 or bits=4 ({BITS})")
                raise ValueError(
                    f"[{op}] q holds {bits}-bit codes (q {list(self.q.shape)} packs "
                    f"{arr.shape[1] * self.group_size} values per row for {label} "
                    f"{list(arr.shape)} with group_size {self.group_size}), not "
                    f"bits={self.bits}: {fix}"
                )
            if tuple(arr.shape) != want:
                raise ValueError(
                    f"[{op}] {label} must have shape [N, K // group_size] = {list(want)} "
                    f"for q of shape {list(self.q.shape)} and group_size "
                    f"{self.group_size}, got {list(arr.shape)}"
                )
        if self.bits == 4:
            if self.per_channel:
                raise ValueError(
                    f"[{op}] per_channel=True needs 8-bit codes (q = w_i8 + 128); a 4-bit "
                    f"weight is group-wise affine: pass per_channel=None or False"
                )
            object.__setattr__(self, "per_channel", False)
        elif self.per_channel is None:
            object.__setattr__(self, "per_channel", _is_per_channel(self.scales, self.biases))

    # Shapes -------------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Output features N."""
        return self.q.shape[0]

    @property
    def k(self) -> int:
        """Input features K."""
        return self.q.shape[1] * (32 // self.bits)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    @property
    def format(self) -> str:
        """Which W8A8 math applies: ``"per_channel"`` or ``"grouped"`` (8-bit codes),
        ``"grouped4"`` (4-bit codes)."""
        if self.bits == 4:
            return GROUPED4
        return PER_CHANNEL if self.per_channel else GROUPED

    # Views for kernels ----------------------------------------------------------------
    def codes(self) -> mx.array:
        """``[N, K]`` uint8 codes ``q``: a view of the 8-bit words (no copy); for a
        4-bit weight the unpacked nibbles (a new array, made per call: the weight keeps
        only the packed words)."""
        if self.bits == 8:
            return self.q.view(mx.uint8)
        return unpack4(self.q)

    def int8(self) -> mx.array:
        """``[N, K]`` int8 ``q - 128`` (``q ^ 0x80``), what the int8 kernels multiply.

        Raises:
            ValueError: for a 4-bit weight (its codes are not offset by 128).
        """
        if self.bits != 8:
            raise ValueError(
                "[mlx_w8a8.QuantizedWeight.int8] the int8 view q - 128 is of 8-bit codes; "
                f"this weight holds {self.bits}-bit codes (use codes())"
            )
        return (self.codes() ^ 0x80).view(mx.int8)

    def derived(self, key, make):
        """``make()``, made on the first call with ``key`` and kept with this weight
        (not compared, not copied by ``attrs.evolve``): arrays a backend derives from
        the weight once, e.g. the CUDA TMA GEMM's map array
        (``kernels.cuda.tma.weight_maps``)."""
        got = self._derived.get(key)
        if got is None:
            got = self._derived[key] = make()
        return got

    @functools.cached_property
    def channel_scales(self) -> mx.array:
        """``[N]`` float32 per-channel scales ``s_n`` (meaningful when ``per_channel``)."""
        return self.scales[:, 0].astype(mx.float32)

    @functools.cached_property
    def group_offsets(self) -> mx.array:
        """``[N, K // group_size]`` float32 ``b' = bias + 128 * scale``.

        With it the grouped W8A8 product is
        ``sum_g s_g * (x_q . (q - 128))_g + b'_g * sum_{k in g} x_q`` (``docs/numerics.md``,
        grouped W8A8 linear). 8-bit weights only: 4-bit codes are not offset by 128
        (their W4A8 product uses ``biases`` as they are).

        Raises:
            ValueError: for a 4-bit weight.
        """
        if self.bits != 8:
            raise ValueError(
                "[mlx_w8a8.QuantizedWeight.group_offsets] b + 128 s is the offset of 8-bit "
                f"codes; this weight holds {self.bits}-bit codes (use biases)"
            )
        return self.biases.astype(mx.float32) + 128.0 * self.scales.astype(mx.float32)

    def dequantize(self) -> mx.array:
        """``[N, K]`` float weight, as ``mx.dequantize`` gives it (scales' dtype)."""
        return mx.dequantize(self.q, self.scales, self.biases, self.group_size, self.bits)

    # Constructors -----------------------------------------------------------------------
    @classmethod
    def from_float(
        cls, w: mx.array, group_size: int = 64, per_channel: bool = True, bits: int = 8
    ) -> "QuantizedWeight":
        """Quantize a float weight.

        Args:
            w: ``[N, K]`` float16/bfloat16/float32.
            group_size: 32, 64 or 128, dividing K.
            per_channel: ``True`` for symmetric per-channel int8 (``s_n = max|w_n| /
                127``, the format int8 GEMM runs on directly); ``False`` for group-wise
                affine exactly as ``mx.quantize(w, group_size, bits=8)``.
            bits: 8 (the default) or 4. ``bits=4`` is group-wise affine exactly as
                ``mx.quantize(w, group_size, bits=4)`` (``per_channel`` must be
                ``False``): MLX's arrays as they are.

        Returns:
            The weight. Group-wise: ``mx.quantize``'s arrays, except that a group whose
            codes are all 0 (``w = bias`` whatever the scale: MLX stores ``-1e-7`` for an
            all-zero group) gets scale 0, so the W8A8 fold ``b' = b + 128 s`` gives its
            bias exactly (:func:`zero_code_scales`). Per-channel: scales and biases in
            ``w``'s dtype, as ``mx.quantize`` keeps them, unless a row's scale is not
            representable there (:func:`channel_dtype`): then in float32; a scale
            below the dtype's normal range is rounded up (:func:`stored_scale`).
        """
        op = "mlx_w8a8.quantize_weight"
        if not isinstance(w, mx.array) or w.dtype not in FLOAT_DTYPES:
            raise ValueError(
                f"[{op}] w must be a float16, bfloat16 or float32 array, got {describe(w)}"
            )
        if w.ndim != 2:
            raise ValueError(f"[{op}] w must be 2-D [N, K], got shape {list(w.shape)}")
        check_group_size(op, group_size, w.shape[1])
        if isinstance(bits, bool) or bits not in BITS:
            raise ValueError(f"[{op}] bits must be one of {BITS}, got {bits!r}")
        if bits == 4:
            if per_channel:
                raise ValueError(
                    f"[{op}] bits=4 is group-wise affine only: pass per_channel=False "
                    f"(got per_channel={per_channel!r})"
                )
            q, scales, biases = mx.quantize(w, group_size=group_size, bits=4)
            return cls(q, scales, biases, group_size, per_channel=False, bits=4)
        if not per_channel:
            q, scales, biases = mx.quantize(w, group_size=group_size, bits=8)
            # per_channel given, not inferred: a weight whose groups share their scales
            # (all zero, say) is still the group-wise weight the caller asked for.
            return cls(q, zero_code_scales(q, scales, group_size), biases, group_size,
                       per_channel=False)
        wf = w.astype(mx.float32)
        # The scale is rounded to the storage dtype first and the codes are computed
        # from the stored scale, so dequantization reproduces exactly s_n * w_i8.
        scale32 = mx.max(mx.abs(wf), axis=1, keepdims=True) / 127.0
        dtype = channel_dtype(scale32, w.dtype)
        scale = stored_scale(scale32, dtype)
        sf = scale.astype(mx.float32)
        safe = mx.where(sf > 0, sf, 1.0)
        w_i8 = mx.clip(mx.round(wf / safe), -127, 127)
        codes = (w_i8 + 128).astype(mx.uint8)
        groups = w.shape[1] // group_size
        scales = mx.broadcast_to(scale, (w.shape[0], groups))
        # contiguous: an elementwise op on a broadcast keeps broadcast strides, and MLX's
        # CUDA quantized_matmul has no kernel for non-row-contiguous biases.
        biases = mx.contiguous((-128.0 * scales.astype(mx.float32)).astype(dtype))
        q = mx.contiguous(codes).view(mx.uint32)
        return cls(q, mx.contiguous(scales), biases, group_size, per_channel=True)

    @classmethod
    def from_int8(
        cls, w_i8: mx.array, scales: mx.array, group_size: int = 64
    ) -> "QuantizedWeight":
        """Store a symmetric per-channel int8 weight in the affine layout.

        Args:
            w_i8: ``[N, K]`` int8.
            scales: ``[N]`` or ``[N, 1]`` float per-channel scales.
            group_size: 32, 64 or 128, dividing K.

        Returns:
            The weight, its scales and biases (``-128 * scales``) in ``scales``' dtype,
            or in float32 where ``255 |s|`` overflows that dtype (a float16 scale above
            about 256: MLX's dequantizer forms ``s * q`` with ``q <= 255`` in the
            scales' dtype, and ``-128 s`` is stored).
        """
        op = "mlx_w8a8.QuantizedWeight.from_int8"
        if not isinstance(w_i8, mx.array) or w_i8.dtype != mx.int8 or w_i8.ndim != 2:
            raise ValueError(f"[{op}] w_i8 must be a [N, K] int8 array, got {describe(w_i8)}")
        n, k = w_i8.shape
        check_group_size(op, group_size, k)
        if not isinstance(scales, mx.array) or scales.dtype not in FLOAT_DTYPES or (
            scales.size != n or scales.ndim not in (1, 2)
        ):
            raise ValueError(
                f"[{op}] scales must be a float [N] or [N, 1] array with N = {n}, "
                f"got {describe(scales)}"
            )
        dtype = channel_dtype(scales.astype(mx.float32), scales.dtype)
        s = mx.broadcast_to(scales.reshape(n, 1).astype(dtype), (n, k // group_size))
        codes = (w_i8.view(mx.uint8) ^ 0x80)
        q = mx.contiguous(codes).view(mx.uint32)
        biases = mx.contiguous((-128.0 * s.astype(mx.float32)).astype(dtype))
        return cls(q, mx.contiguous(s), biases, group_size, per_channel=True)


def channel_dtype(scales: mx.array, dtype: mx.Dtype) -> mx.Dtype:
    """The dtype to store per-channel ``scales`` and ``biases = -128 * scales`` in:
    ``dtype`` (the weight's, as mlx-lm keeps them) where ``255 |s|`` fits it, else
    float32 (MLX's dequantizer and ``mx.quantized_matmul`` form ``s * q``, ``q <= 255``,
    in the scales' dtype: a float16 row with ``max |w|`` above about 32.6k would give
    inf).
    One host sync, for a 16-bit ``dtype`` only.

    Args:
        scales: float32 scales (any shape).
        dtype: the storage dtype asked for.
    """
    if dtype == mx.float32:
        return dtype
    big = mx.any(mx.abs(scales.astype(mx.float32)) * 255.0 > mx.finfo(dtype).max)
    return mx.float32 if big.item() else dtype


def stored_scale(scale: mx.array, dtype: mx.Dtype) -> mx.array:
    """Float32 per-channel ``scale`` (``max |w| / 127``) rounded to ``dtype``: to nearest
    where that is a normal number of ``dtype``, else up to a multiple of its smallest
    subnormal ``2^-24`` (float16) or ``2^-133`` (bfloat16).

    Hazard of rounding to nearest there: a float16 row with ``max |w| < ~3.8e-6`` gets
    scale 0 (a row of zeros), and a subnormal scale may fall below ``max |w| / 127``,
    clipping the largest codes. Rounded up, the scale of a nonzero row is never 0 and no
    code clips; a float16 row with ``max |w| <= 127 * 2^-24`` is stored exactly (its
    values are multiples of ``2^-24``).
    """
    if dtype == mx.float32:
        return scale.astype(mx.float32)
    info = mx.finfo(dtype)
    tiny = info.smallest_normal * info.eps
    up = mx.ceil(scale / tiny) * tiny  # exact in float32 below the smallest normal
    return mx.where(scale < info.smallest_normal, up, scale).astype(dtype)


def zero_code_scales(q: mx.array, scales: mx.array, group_size: int) -> mx.array:
    """``scales`` with 0 for every group whose 8-bit codes are all 0.

    Such a group dequantizes to ``bias`` whatever its scale, but the grouped W8A8 math
    ``s P + (b + 128 s) R`` (``P = -128 R`` there) gives the bias only in exact
    arithmetic: with MLX's scale of ``-1e-7`` for an all-zero group, float32 sums of the
    two terms in different orders leave ``~1e-11`` instead of 0. With scale 0 both terms
    are exact in every kernel, whatever order it sums in.

    Args:
        q: ``[N, K // 4]`` uint32 packed codes; scales: ``[N, K // group_size]``.
    """
    n = q.shape[0]
    codes = q.view(mx.uint8).reshape(n, -1, group_size)
    return mx.where(mx.max(codes, axis=-1) == 0, mx.zeros_like(scales), scales)


def unpack4(q: mx.array) -> mx.array:
    """``[N, K]`` uint8 codes of ``[N, K // 8]`` uint32 words of 4-bit codes (MLX's
    order: code ``j`` of a word in bits ``4j .. 4j + 3``; on the little-endian bytes,
    element ``2i`` is the low nibble of byte ``i`` and ``2i + 1`` its high nibble)."""
    b = q.view(mx.uint8)
    n = b.shape[0]
    return mx.stack([b & 0xF, b >> 4], axis=-1).reshape(n, -1)


def _packed_bits(q: mx.array, scales: mx.array, biases: mx.array, group_size: int) -> int | None:
    """The bits per code that ``q`` holds if ``scales`` and ``biases`` (of one shape)
    describe its rows (``None`` when the shapes do not say): 32 bits per word over the
    values per row."""
    if not isinstance(biases, mx.array) or tuple(biases.shape) != tuple(scales.shape):
        return None
    if scales.ndim != 2 or scales.shape[0] != q.shape[0] or scales.shape[1] < 1:
        return None
    values = scales.shape[1] * group_size
    words = q.shape[1] * 32
    return words // values if words % values == 0 else None


def _is_per_channel(scales: mx.array, biases: mx.array) -> bool:
    """Whether every row has one scale and ``bias == -128 * scale`` (host sync, once)."""
    s = scales.astype(mx.float32)
    b = biases.astype(mx.float32)
    uniform = mx.all(s == s[:, :1])
    symmetric = mx.all(b == -128.0 * s)
    return bool((uniform & symmetric).item())
