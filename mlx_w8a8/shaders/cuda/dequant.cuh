// MLX's affine weight codes to 16-bit floats, exactly, and the one rounding of a
// dequantized weight: the code-to-T conversions shared by the dequantizing GEMM
// (gemm_dequant.cu, fragments in registers) and the dequantize kernel (dequantize.cu,
// a weight written out). A header-only file ("// @@ requires dequant.cuh").
//
// Code to T exactly: an 8-bit code q is at most 255, 8 significant bits, exact in
// bfloat16 and float16; the bits 0x4B0000qq read as a float are 2^23 + q, so a float
// subtract gives q and the float's top half is q's bfloat16 (float16: the half bits
// 0x64qq are 1024 + q). A 4-bit code's pair is placed as 128 + q (bfloat16 0x43qq's low
// nibble) or 1024 + q (float16) and the magic subtracted in T, exactly.
//
// A weight is then one packed fma (s, q, b) in T: T(s q + b) rounded once, the rounding
// mx.quantized_matmul's dequantization makes (docs/numerics.md, "Dequantized weights").
// @@ requires common.cuh

namespace w8a8 {

template <typename T>
struct DqType;
template <>
struct DqType<__nv_bfloat16> {
  static constexpr bool kBf16 = true;
  static constexpr uint32_t kOne = 0x3F803F80u;    // 1.0, 1.0
  static constexpr uint32_t kMagic = 0x43004300u;  // 128.0, 128.0 (ulp 1)
  static constexpr uint32_t kMinusMagic = 0xC300C300u;
  static __device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
  }
  // codes8's selectors for bytes i, i + 1 of a word (i even): byte i (and i + 1) under
  // 0x4B000000's top bytes.
  static __device__ __forceinline__ void selectors(int i, uint32_t& lo, uint32_t& hi) {
    lo = 0x7440u | i;
    hi = 0x7440u | (i + 1);
  }
  // Bytes i, i + 1 of w (8-bit codes) as the pair {q_i, q_i+1}, exactly.
  static __device__ __forceinline__ uint32_t codes8(uint32_t w, uint32_t sel_lo, uint32_t sel_hi) {
    const float f0 = __fsub_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, sel_lo)), 8388608.f);
    const float f1 = __fsub_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, sel_hi)), 8388608.f);
    return __byte_perm(__float_as_uint(f0), __float_as_uint(f1), 0x7632);
  }
};
template <>
struct DqType<__half> {
  static constexpr bool kBf16 = false;
  static constexpr uint32_t kOne = 0x3C003C00u;    // 1.0, 1.0
  static constexpr uint32_t kMagic = 0x64006400u;  // 1024.0, 1024.0 (ulp 1)
  static constexpr uint32_t kMinusMagic = 0xE400E400u;
  static __device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
  }
  // codes8's selector: bytes i, i + 1 interleaved with 0x64 bytes (one permute a pair).
  static __device__ __forceinline__ void selectors(int i, uint32_t& lo, uint32_t& hi) {
    lo = 0x4040u | i | ((i + 1) << 8);
    hi = 0;
  }
  static __device__ __forceinline__ uint32_t codes8(uint32_t w, uint32_t sel_lo, uint32_t) {
    return fma2(__byte_perm(w, 0x64646464u, sel_lo), kOne, kMinusMagic);
  }
};

// The two 4-bit codes of byte `b` of w (low nibble first) as the pair {q_lo, q_hi}: the
// byte alone (b in 0..3), times 4097 puts the high nibble at bits 16-19 (no carries: the
// two copies do not overlap), the magic's bits fill the rest.
template <typename T>
__device__ __forceinline__ uint32_t dq_codes4(uint32_t w, uint32_t sel) {
  const uint32_t v = __byte_perm(w, 0u, sel) * 4097u;
  return DqType<T>::fma2((v & 0x000F000Fu) | DqType<T>::kMagic, DqType<T>::kOne,
                         DqType<T>::kMinusMagic);
}

}  // namespace w8a8
