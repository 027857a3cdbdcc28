// Per-token int8 quantization, the element-level steps shared by the quantize kernels
// (quantize.cu) and the fused decode kernel (gemv.cu): 16-byte loads of 8 elements, the
// row scale and the codes of docs/numerics.md. A header-only file ("// @@ requires
// quantize.cuh").
//
// Exactness: scale = amax / 127 is an IEEE round-to-nearest division (__fdiv_rn, never a
// reciprocal multiply, which fast-math could substitute), and the codes are rint (half to
// even) of x / scale rounded to nearest: RowQuantizer's fast path proves, element by
// element, that its result equals the division's, and its exact path settles the values
// the fast path cannot from the sign of an FMA remainder. Codes match the float64 oracle
// bit for bit.
// @@ requires shape.cuh

namespace w8a8 {

// Eight consecutive elements of T as raw 16-byte words (one for float16/bfloat16, two
// for float32), and their float values.
template <typename T>
struct Raw8 {
  uint4 w[sizeof(T) / 2];
};

template <typename T>
__device__ __forceinline__ Raw8<T> load_raw8(const T* p) {
  Raw8<T> r;
#pragma unroll
  for (int i = 0; i < (int)(sizeof(T) / 2); ++i) r.w[i] = reinterpret_cast<const uint4*>(p)[i];
  return r;
}

__device__ __forceinline__ void decode8(const Raw8<__half>& r, float (&f)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&r.w[0]);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __half22float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// A bfloat16 is the high half of its float32: one shift or mask per element
// (__bfloat1622float2 spends an extra byte permute on the high element).
__device__ __forceinline__ void decode8(const Raw8<__nv_bfloat16>& r, float (&f)[8]) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(&r.w[0]);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ void decode8(const Raw8<float>& r, float (&f)[8]) {
  const float4 u = reinterpret_cast<const float4&>(r.w[0]);
  const float4 v = reinterpret_cast<const float4&>(r.w[1]);
  f[0] = u.x; f[1] = u.y; f[2] = u.z; f[3] = u.w;
  f[4] = v.x; f[5] = v.y; f[6] = v.z; f[7] = v.w;
}

template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&f)[8]) {
  decode8(load_raw8(p), f);
}

// The row's largest |x| from the raw element bits. IEEE magnitudes order as their bits
// with the sign cleared, and every NaN's bits exceed infinity's, so an unsigned max over
// those bits is the largest magnitude, and not finite iff the row holds a NaN or an
// infinity (fmaxf would drop NaNs). Integer ops only, nothing on the conversion or
// special-function pipes (a quarter of the ALU rate on sm_80/sm_90). 16-bit T: a word
// holds two elements and the max runs on both halves at once (__vmaxu2: one
// VIMNMX3.U16x2 per two words on sm_90), the halves merged only in value().
template <typename T>
struct AbsMax {
  static constexpr uint32_t kMask = sizeof(T) == 2 ? 0x7fff7fffu : 0x7fffffffu;
  uint32_t m = 0u;  // float: |x| bits; 16-bit T: |x| bits of the low and high elements

  __device__ __forceinline__ static uint32_t merge(uint32_t a, uint32_t b) {
    if constexpr (sizeof(T) == 2) {
      return __vmaxu2(a, b);
    } else {
      return max(a, b);
    }
  }

  __device__ __forceinline__ void add(const Raw8<T>& r) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(r.w);
#pragma unroll
    for (int i = 0; i < (int)(sizeof(Raw8<T>) / 4); ++i) m = merge(m, w[i] & kMask);
  }

  __device__ __forceinline__ void reduce_warp() {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = merge(m, __shfl_xor_sync(0xffffffffu, m, o));
  }

  // The block's maximum; every thread of the block must call it (it synchronizes, and
  // `slots` may be reused once it returns).
  __device__ __forceinline__ void reduce_block(uint32_t (&slots)[32]) {
    reduce_warp();
    if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = m;
    __syncthreads();
    m = slots[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) m = merge(m, slots[w]);
    __syncthreads();
  }

  __device__ __forceinline__ float value() const;

  // 16-bit T: the largest |x|'s own bits (sign clear), as the type holds them.
  __device__ __forceinline__ uint32_t bits16() const { return max(m & 0xffffu, m >> 16); }
};

template <>
__device__ __forceinline__ float AbsMax<float>::value() const { return __uint_as_float(m); }
template <>
__device__ __forceinline__ float AbsMax<__nv_bfloat16>::value() const {
  return __uint_as_float(bits16() << 16);
}
template <>
__device__ __forceinline__ float AbsMax<__half>::value() const {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16())));
}

// One row's codes q = clip(rint(x / s), -127, 127), s = amax / 127 (docs/numerics.md),
// with x / s rounded to nearest as an IEEE division would. No division per element on
// rows whose scale is at least 2^-100 (every row a model makes); z = x / s below is the
// exact real quotient, RN(z) what __fdiv_rn returns, r = RN(1 / s).
//
// Fast path: t = RN(x r + 1.5 * 2^23) (one FFMA) holds n = rint(x r) (round to nearest,
// ties to even, exact for |x r| < 2^22) as t - 1.5 * 2^23, and dd = RN(x r - n).
// Bound: |x| <= amax, so |z| < 127.0001; r = (1 / s)(1 + e), |e| <= 2^-24, so
// |x r - z| < 2^-17; RN(z) is within 2^-18 of z and dd within 2^-25 of x r - n:
// |RN(z) - n - dd| < 2^-16. Hence when |dd| < 1/2 - 2^-14 (kFastMargin), RN(z) lies
// strictly inside (n - 1/2, n + 1/2) and its rint is n; |n| <= 127 follows from the
// bound (no clip needed). The value's code is the low byte of t's bits (0x4B400000 + n)
// and the 8 codes' sum is the bits' sum - 8 * 0x4B400000 (mod 2^32, exact: the true sum
// is small). A chunk of 8 takes the exact path below when any |dd| reaches the margin:
// bfloat16 rows do in about a quarter of a warp's chunk steps (docs/cuda.md), so that
// path is arithmetic too (no division, no branch inside it).
//
// Exact path (settle_bits), for every value of such a chunk: h = n + copysign(1/2, dd),
// the half-integer nearest x r (|z - h| < 1/2 + 2^-17), and e = RN(x - h s) (one FFMA).
// RN(z) is one of h, above h, below h, and rint(RN(z)) is respectively rint(h) (half to
// even), h + 1/2, h - 1/2. RN(z) != h iff |z - h| exceeds half the float gap next to h
// on z's side, i.e. |x - h s| > 2^(j-24) s with 2^j <= |h| < 2^(j+1) (the gap is 2^(j-23)
// on both sides of every half-integer but 1/2, whose gap toward 0 is half that; there
// RN(z) < 1/2 and RN(z) = 1/2 both give code 0, so the wider threshold is right too).
// A quotient of two floats never lies exactly on a float midpoint, so no tie arises at
// the threshold. The comparison is exact: thr = 2^j * (s 2^-24) is a power-of-two
// scaling (>= 2^-125, normal, since s >= 2^-100), and x - h s is a float whenever
// |x - h s| <= 2^(E-2), s in [2^E, 2^(E+1)): then |z| >= 1/4, |x| >= 2^(E-2), so x and
// h s are multiples of 2^(E-25) (h s: h has a 1/2 bit, s an ulp of 2^(E-23)) and the
// difference, at most 2^23 such units, fits a float's 24 bits; a larger |x - h s|
// rounds to at least 2^(E-2) > 2^(E-17) > thr, on the same side. The code's bits are
// those of RN(c + 1.5 * 2^23) with c = h +- 1/2 (an integer, exact) or c = h (a tie for
// the addition, which rounds it to the even integer as rint does), so packing and sum
// are the fast path's.
// Rows whose scale is below 2^-100 (values near denormals, 1 / s near overflow) take the
// IEEE division __fdiv_rn, rintf and the clip; a model's activations practically never
// have such rows.
// All three give the codes of the division (tests/test_cuda.py on the GPU; the fast and
// exact paths modelled in float32 on the CPU by tests/test_quantize_rounding.py).
struct RowQuantizer {
  static constexpr float kRound = 12582912.0f;        // 1.5 * 2^23
  static constexpr uint32_t kRoundBits = 0x4B400000u;  // its bits
  static constexpr float kFastMargin = 0.49993896484375f;  // 1/2 - 2^-14
  static constexpr float kTwoM24 = 5.9604644775390625e-08f;  // 2^-24
  float s;      // the row scale: amax / 127; NaN for a non-finite row, 0 for a zero row
  float r;      // RN(1 / s), for the fast path
  float u;      // s * 2^-24 (exact), the exact path's threshold unit
  bool usable;  // finite amax > 0 (else every code is 0)
  bool fast;    // usable and s >= 2^-100

  __device__ __forceinline__ static RowQuantizer of(float amax) {
    RowQuantizer q;
    const bool finite = amax <= 3.402823466e38f;  // false for +inf and NaN
    q.usable = finite && amax > 0.f;
    q.s = finite ? __fdiv_rn(amax, 127.0f) : __int_as_float(0x7fc00000);
    q.fast = q.usable && q.s >= __int_as_float(0x0D800000);  // 2^-100
    q.r = q.fast ? __frcp_rn(q.s) : 0.f;
    q.u = __fmul_rn(q.s, kTwoM24);
    return q;
  }

  // The bits of rint(RN(x / s)) + 1.5 * 2^23 from x and the fast path's t (the exact path
  // above; dd is the fast path's expression again, which the compiler shares with it).
  __device__ __forceinline__ uint32_t settle_bits(float x, float t) const {
    const float n = __fsub_rn(t, kRound);
    const float dd = __fmaf_rn(x, r, -n);
    const float h = __fadd_rn(n, copysignf(0.5f, dd));
    const float e = __fmaf_rn(-h, s, x);
    const float thr = __fmul_rn(__uint_as_float(__float_as_uint(h) & 0x7f800000u), u);
    const float c = fabsf(e) > thr ? __fadd_rn(h, copysignf(0.5f, e)) : h;
    return __float_as_uint(__fadd_rn(c, kRound));
  }

  // The codes in 8 values' bits, packed little-endian into two words; returns their sum.
  __device__ __forceinline__ static int pack8(const uint32_t (&b)[8], uint32_t (&packed)[2]) {
    packed[0] = __byte_perm(__byte_perm(b[0], b[1], 0x0040), __byte_perm(b[2], b[3], 0x0040),
                            0x5410);
    packed[1] = __byte_perm(__byte_perm(b[4], b[5], 0x0040), __byte_perm(b[6], b[7], 0x0040),
                            0x5410);
    uint32_t sum = 0u;
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += b[i];
    return static_cast<int>(sum - 8u * kRoundBits);
  }

  // Codes of 8 values, packed little-endian into two words; returns their sum. Only for
  // rows with `fast` set (codes8 checks it; quantize.cu's straight-line path calls it directly).
  __device__ __forceinline__ int fast_codes8(const float (&f)[8], uint32_t (&packed)[2]) const {
    uint32_t b[8];
    float d = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float t = __fmaf_rn(f[i], r, kRound);
      d = fmaxf(d, fabsf(__fmaf_rn(f[i], r, -__fsub_rn(t, kRound))));
      b[i] = __float_as_uint(t);
    }
    if (d >= kFastMargin) {
#pragma unroll
      for (int i = 0; i < 8; ++i) b[i] = settle_bits(f[i], __uint_as_float(b[i]));
    }
    return pack8(b, packed);
  }

  // Codes of 8 values, packed little-endian into two words; returns their sum.
  __device__ __forceinline__ int codes8(const float (&f)[8], uint32_t (&packed)[2]) const {
    if (fast) return fast_codes8(f, packed);
    int sum = 0;
    packed[0] = packed[1] = 0u;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int v = 0;
      if (usable) {
        float t = rintf(__fdiv_rn(f[i], s));
        t = fminf(fmaxf(t, -127.f), 127.f);
        v = static_cast<int>(t);
      }
      sum += v;
      packed[i >> 2] |= (static_cast<uint32_t>(v) & 0xffu) << ((i & 3) * 8);
    }
    return sum;
  }

  // Codes of 8 values written to q (8 bytes, 8-byte aligned); returns their sum.
  __device__ __forceinline__ int store_codes8(const float (&f)[8], int8_t* q) const {
    uint32_t packed[2];
    const int sum = codes8(f, packed);
    *reinterpret_cast<uint2*>(q) = make_uint2(packed[0], packed[1]);
    return sum;
  }

  // Codes of 8 values from one rate alone (tie_free_rate), packed; returns their sum.
  __device__ __forceinline__ static int rate_codes8(const float (&f)[8], float rate,
                                                    uint32_t (&packed)[2]) {
    uint32_t b[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) b[i] = __float_as_uint(__fmaf_rn(f[i], rate, kRound));
    return pack8(b, packed);
  }
};

// Rows of 16-bit values need no per-value check: the codes of the division are
// rint(x r1) for every x of the row, r1 = RN(r (1 +- 2^-21)), where
//   - the row's maximum has an integer significand A (the type's mantissa and implicit
//     bit; the mantissa alone if subnormal) that 127 does not divide, and its scale takes
//     the fast path;
//   - the sign is that of the code of x = amax / 2 (64 or 63: one division per row).
// Why. Let q = 127 x / amax (real): z = x / s = q (amax / 127) / s is within |q| 2^-24 of
// q, and RN(z) within |q| 2^-23. x = X u and amax = A 2^D u for x's unit u (amax >= |x|
// has a unit 2^D u, D >= 0), X < 2^(p+1) with p the mantissa bits. For a half-integer
// h = j + 1/2, q - h = (254 X - (2j + 1) A 2^D) / (2 A 2^D): an integer over 2 A 2^D.
// It is 0 only if 127 divides 2j + 1 (it divides neither A nor 2^D): then h = 63.5 o, o
// odd, and |h| = |q| <= 127, so x = +-amax / 2. Otherwise |q - h| >= 1 / (2 A 2^D) >
// |q| / (254 * 2^(p+1)), above |q| 2^-19 for float16 (p = 10) and |q| 2^-16 for
// bfloat16 (p = 7), while |x r1 - q| <= |q| (2^-21 + 3 * 2^-24) < |q| 2^-20: x r1 and
// RN(z) lie strictly on q's side of every half-integer, and their rints agree
// (t = RN(x r1 + 1.5 * 2^23) is rint(x r1), as on the fast path). At x = +-amax / 2,
// q = +-63.5 exactly and x r lies within 63.5 * 2^-23 of it on either side; the factor
// 1 +- 2^-21 moves x r1 at least 63.5 (2^-21 - 3 * 2^-24) away, to the division's side.
// Rows with 127 | A (bfloat16: 254; float16: 1143 ... 2032, 8 of 1024 significands)
// keep the checked path. Modelled over every significand and every value under it by
// tests/test_quantize_rounding.py (where factors of 1 and 1 +- 2^-17 fail); the kernel
// is checked on the GPU by tests/test_cuda.py.
template <typename T>
struct Mantissa16;  // the mantissa bits of a 16-bit type
template <>
struct Mantissa16<__half> {
  static constexpr int bits = 10;
};
template <>
struct Mantissa16<__nv_bfloat16> {
  static constexpr int bits = 7;
};

// r1 for a row (above), or 0 where the row keeps the checked path (float32 rows, 127 | A,
// a scale off the fast path). `a` is amax.value(), which the caller has read.
template <typename T>
__device__ __forceinline__ float tie_free_rate(const AbsMax<T>& amax, float a,
                                               const RowQuantizer& qz) {
  if constexpr (sizeof(T) != 2) {
    return 0.f;
  } else {
    const uint32_t b = amax.bits16();
    constexpr int kMant = Mantissa16<T>::bits;
    const uint32_t mant = b & ((1u << kMant) - 1u);
    const uint32_t sig = (b >> kMant) ? (mant | (1u << kMant)) : mant;
    if (!qz.fast || sig % 127u == 0u) return 0.f;
    const float half = __fdiv_rn(__fmul_rn(0.5f, a), qz.s);
    const bool up = rintf(half) == 64.f;
    return __fmul_rn(qz.r, up ? 1.000000476837158203125f : 0.999999523162841796875f);
  }
}

}  // namespace w8a8
